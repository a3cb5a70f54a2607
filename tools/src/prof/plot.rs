//! The scaling plot (images/s against threads), as SVG or PNG.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

use super::render::fmt_rate;
use super::report::Report;
use super::stage::Stage;

/// Turns plotters' backend-specific errors into anyhow errors.
pub(crate) trait PlotResult<T> {
    /// The result, with a plotting error as an anyhow error.
    fn plot(self) -> Result<T>;
}

impl<T, E: std::fmt::Debug> PlotResult<T> for std::result::Result<T, E> {
    fn plot(self) -> Result<T> {
        self.map_err(|e| anyhow!("plotting: {e:?}"))
    }
}

/// Checks that `path` names a plot format [`plot_scaling`] and [`plot_metrics`](super::plot_metrics) can write
/// (`.svg` or `.png`).
pub fn check_plot_path(path: &Path) -> Result<()> {
    backend_of(path).map(|_| ())
}

/// Which plotters backend a file name asks for.
pub(crate) fn backend_of(path: &Path) -> Result<&'static str> {
    match path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("svg") => Ok("svg"),
        Some("png") => Ok("png"),
        _ => bail!("{}: plot files must end in .svg or .png", path.display()),
    }
}

/// Draws into an RGB buffer and writes it to `path` as a PNG. The encoding is done by the
/// `image` crate ddl already uses: plotters' own encoder would compile a second, older `image`.
pub(crate) fn write_png(
    path: &Path,
    (width, height): (u32, u32),
    draw: impl FnOnce(DrawingArea<BitMapBackend, Shift>) -> Result<()>,
) -> Result<()> {
    let mut rgb = vec![0u8; width as usize * height as usize * 3];
    draw(BitMapBackend::with_buffer(&mut rgb, (width, height)).into_drawing_area())?;
    image::save_buffer(path, &rgb, width, height, image::ExtendedColorType::Rgb8)?;
    Ok(())
}

/// Draws images/s against threads for every stage and end to end (log-log) to `path`
/// (`.svg` or `.png`).
pub fn plot_scaling(r: &Report, path: &Path) -> Result<()> {
    let size = (1000, 650);
    match backend_of(path)? {
        "svg" => draw_scaling(SVGBackend::new(path, size).into_drawing_area(), r),
        _ => write_png(path, size, |area| draw_scaling(area, r)),
    }
    .with_context(|| format!("draw {}", path.display()))
}

fn draw_scaling<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, r: &Report) -> Result<()> {
    root.fill(&WHITE).plot()?;
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Stage::ALL
        .iter()
        .map(|&st| {
            let pts = r
                .stages
                .iter()
                .filter(|x| x.stage == st)
                .map(|x| (x.threads as f64, x.images_per_s.max(1e-3)))
                .collect();
            (st.name().to_string(), pts)
        })
        .collect();
    series.push((
        "end_to_end".to_string(),
        r.end_to_end
            .iter()
            .map(|x| (x.threads as f64, x.images_per_s.max(1e-3)))
            .collect(),
    ));
    let all: Vec<(f64, f64)> = series.iter().flat_map(|(_, p)| p.iter().copied()).collect();
    let xmax = all.iter().map(|p| p.0).fold(1.0, f64::max);
    let ymin = all.iter().map(|p| p.1).fold(f64::MAX, f64::min).min(1e9);
    let ymax = all.iter().map(|p| p.1).fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "ddl-prof: {} node {}/{}, images/s per stage vs threads",
                r.dataset.split, r.dataset.node, r.dataset.nodes
            ),
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(
            (0.8f64..xmax * 1.25).log_scale(),
            (ymin / 2.0..ymax * 2.0).log_scale(),
        )
        .plot()?;
    chart
        .configure_mesh()
        .x_desc("threads")
        .y_desc("images/s")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| fmt_rate(*y))
        .draw()
        .plot()?;
    for (i, (name, pts)) in series.into_iter().enumerate() {
        if pts.is_empty() {
            continue;
        }
        let e2e = name == "end_to_end";
        let color: RGBAColor = if e2e {
            BLACK.to_rgba()
        } else {
            Palette99::pick(i).to_rgba()
        };
        let style = color.stroke_width(if e2e { 4 } else { 2 });
        chart
            .draw_series(LineSeries::new(pts.clone(), style))
            .plot()?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart
            .draw_series(pts.into_iter().map(|p| Circle::new(p, 4, color.filled())))
            .plot()?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .plot()?;
    root.present().plot()?;
    Ok(())
}
