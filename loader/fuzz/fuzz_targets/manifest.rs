//! Fuzz target: arbitrary bytes as `manifest.json`, through `Manifest::load` (JSON parsing and
//! validation). Nothing may panic; errors must name the manifest file; an accepted manifest
//! must survive a save/load round trip with every
//! field a reader uses unchanged.

#![no_main]

use ddl_loader::manifest::Manifest;
use ddl_loader_fuzz::scratch_dir;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = scratch_dir().join("manifest");
    std::fs::create_dir_all(&dir).expect("create manifest scratch directory");
    std::fs::write(dir.join("manifest.json"), data).expect("write scratch manifest");
    match Manifest::load(&dir) {
        Ok(m) => {
            let _ = m.num_classes();
            m.save(&dir).expect("save an accepted manifest");
            let back = Manifest::load(&dir).expect("reload a saved manifest");
            // `pack` is free-form JSON whose floats need not round-trip bit for bit through
            // serde_json; everything a reader relies on must.
            assert_eq!(
                (back.format_version, &back.classes, &back.splits, back.nodes),
                (m.format_version, &m.classes, &m.splits, m.nodes)
            );
        }
        Err(e) => assert!(e.to_string().contains("manifest.json"), "{e}"),
    }
});
