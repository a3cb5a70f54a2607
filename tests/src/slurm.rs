//! A Slurm cluster of one node on this machine, for the tests of ddl under Slurm: `munged`,
//! `slurmctld` and `slurmd` (Debian's `munge` and `slurm-wlm`, which `make setup` installs)
//! run as children of the test with a generated `slurm.conf`, key and state in a scratch
//! directory; no system file is read or changed, and dropping the [`Cluster`] cancels its jobs
//! and stops the daemons. The commands (`srun`, `sbatch`, ...) reach it through `SLURM_CONF`.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::TempDir;

/// The node's name in `slurm.conf` (its host is this machine, reached at 127.0.0.1).
const NODE: &str = "ddl-node";
/// Seconds from SIGTERM to SIGKILL when a job is cancelled or reaches its time limit: a real
/// cluster's value (Slurm's default is 30), longer than the 30 s by which slurmctld may be
/// late to end a job at its time limit, so that such a job is stopped by Slurm's SIGTERM and
/// not by ddl-train stopping itself ahead of the limit's SIGKILL.
pub const KILL_WAIT_S: u64 = 60;
/// How long the daemons may take to come up, and a job to leave the queue at the end.
const SETTLE: Duration = Duration::from_secs(60);

/// The running cluster.
pub struct Cluster {
    dir: TempDir,
    conf: PathBuf,
    daemons: Vec<(&'static str, Child)>,
    /// When slurmctld was started.
    controller_started: Instant,
    /// Job scripts written so far (they are numbered).
    scripts: AtomicUsize,
}

/// The Slurm programs the cluster runs, all in `slurm-wlm` and `munge`.
const PROGRAMS: [&str; 6] = [
    "munged",
    "slurmctld",
    "slurmd",
    "srun",
    "sbatch",
    "scontrol",
];

impl Cluster {
    /// Starts the daemons and waits until the node takes jobs; panics with their logs when
    /// they do not come up. Run as root (slurmd starts each job as its user).
    pub fn start() -> Cluster {
        for program in PROGRAMS {
            assert!(
                which(program).is_some(),
                "{program} not found: `make setup` installs Debian's slurm-wlm and munge"
            );
        }
        // SAFETY: getuid(2) has no preconditions.
        let uid = unsafe { libc::getuid() };
        assert_eq!(uid, 0, "the Slurm tests start slurmd, which runs as root");
        let dir = crate::scratch("slurm");
        let conf = dir.path().join("slurm.conf");
        std::fs::write(&conf, config(dir.path())).expect("writing slurm.conf");
        std::fs::write(dir.path().join("plugstack.conf"), "").expect("plugstack.conf");
        for sub in ["state", "spool"] {
            std::fs::create_dir(dir.path().join(sub)).expect("state directories");
        }
        let mut cluster = Cluster {
            dir,
            conf,
            daemons: Vec::new(),
            controller_started: Instant::now(),
            scripts: AtomicUsize::new(0),
        };
        cluster.start_munge();
        let conf = cluster.conf.clone();
        cluster.controller_started = Instant::now();
        cluster.spawn("slurmctld", &["-D", "-i", "-f"], &conf);
        cluster.spawn("slurmd", &["-D", "-N", NODE, "-f"], &conf);
        cluster.wait_until("the node is idle", |c| {
            let out = c.command("sinfo").args(["-h", "-o", "%T"]).output();
            out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "idle")
        });
        cluster
    }

    /// When slurmctld started: it ends the jobs past their time limit at checks every 30 s
    /// (within a second) from then on.
    pub fn controller_started(&self) -> Instant {
        self.controller_started
    }

    /// Scratch space of the cluster's tests (removed with it).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A Slurm command (`srun`, `sbatch`, `scancel`, ...) of this cluster.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("SLURM_CONF", &self.conf);
        cmd
    }

    /// Submits the bash `script` (its text) with the `sbatch` options `args`, its output into
    /// `output`; returns the job id.
    pub fn sbatch(&self, args: &[&str], script: &str, output: &Path) -> String {
        let n = self.scripts.fetch_add(1, Ordering::SeqCst);
        let path = self.dir().join(format!("job-{n}.sh"));
        std::fs::write(&path, format!("#!/bin/bash\n{script}\n")).expect("job script");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let out = self
            .command("sbatch")
            .args(["--parsable", "-o"])
            .arg(output)
            .args(args)
            .arg(&path)
            .output()
            .expect("running sbatch");
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            out.status.success() && !text.is_empty(),
            "sbatch {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
        text
    }

    /// A field of `scontrol show job -o ID` (`JobState`, `ExitCode`, `StartTime`...).
    pub fn job_field(&self, id: &str, field: &str) -> Option<String> {
        let out = self
            .command("scontrol")
            .args(["show", "job", "-o", id])
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(field)?.strip_prefix('=').map(String::from))
    }

    /// Waits until job `id` has left the running states, at most `limit`; its `JobState`
    /// (`COMPLETED`, `CANCELLED`, `TIMEOUT`, `FAILED`...).
    pub fn wait_end(&self, id: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let state = self.job_field(id, "JobState").unwrap_or_default();
            if !matches!(
                state.as_str(),
                "PENDING" | "RUNNING" | "COMPLETING" | "CONFIGURING"
            ) {
                return state;
            }
            assert!(
                Instant::now() < deadline,
                "job {id} still {state} after {limit:?}\n{}",
                self.logs()
            );
            // Each look is an scontrol process: not too often.
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The daemons' logs, last lines, for failure messages.
    pub fn logs(&self) -> String {
        ["munged.log", "slurmctld.log", "slurmd.log"]
            .iter()
            .map(|name| {
                let text = std::fs::read_to_string(self.dir().join(name)).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(30).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!("--- {name}\n{}", tail.join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn start_munge(&mut self) {
        let dir = self.dir().to_path_buf();
        let key = dir.join("munge.key");
        let mut bytes = vec![0u8; 1024];
        let mut random = std::fs::File::open("/dev/urandom").expect("/dev/urandom");
        std::io::Read::read_exact(&mut random, &mut bytes).expect("random key");
        std::fs::write(&key, bytes).expect("munge key");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).expect("chmod");
        let socket = dir.join("munge.socket");
        let arg = |flag: &str, name: &str| format!("--{flag}={}", dir.join(name).display());
        let args = [
            "-F".to_string(),
            "--force".to_string(),
            format!("--key-file={}", key.display()),
            format!("--socket={}", socket.display()),
            arg("pid-file", "munged.pid"),
            arg("log-file", "munged.log"),
            arg("seed-file", "munged.seed"),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.spawn("munged", &args, Path::new(""));
        self.wait_until("munged's socket", |_| socket.exists());
    }

    /// Starts `program ARGS [last]` as a child that dies with this thread (PR_SET_PDEATHSIG),
    /// its output into `PROGRAM.out`.
    fn spawn(&mut self, program: &'static str, args: &[&str], last: &Path) {
        let out = std::fs::File::create(self.dir().join(format!("{program}.out"))).expect("log");
        let mut cmd = Command::new(program);
        cmd.args(args);
        if !last.as_os_str().is_empty() {
            cmd.arg(last);
        }
        // SAFETY: prctl(2) is async-signal-safe; nothing else runs in the forked child.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {program}: {e}"));
        self.daemons.push((program, child));
    }

    /// Polls `done` every 100 ms for up to [`SETTLE`]; panics with the logs.
    fn wait_until(&mut self, what: &str, done: impl Fn(&Cluster) -> bool) {
        let deadline = Instant::now() + SETTLE;
        while !done(self) {
            let exited = self.daemons.iter_mut().find_map(|(name, child)| {
                let status = child.try_wait().ok()??;
                Some(format!("{name} exited ({status})"))
            });
            if let Some(exited) = exited {
                panic!("{exited} before {what}\n{}", self.logs());
            }
            assert!(
                Instant::now() < deadline,
                "no {what} within {SETTLE:?}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The jobs first (their steps run under slurmd's slurmstepd, not as our children).
        let _ = self.command("scancel").arg("--user=root").status();
        let deadline = Instant::now() + SETTLE;
        while Instant::now() < deadline {
            let out = self.command("squeue").args(["-h", "-o", "%i"]).output();
            if out.map_or(true, |o| o.stdout.iter().all(u8::is_ascii_whitespace)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        // What a job left running (an `mpirun` whose batch shell was killed under it): every
        // process with this cluster's configuration in its environment.
        let conf = format!("SLURM_CONF={}", self.conf.display());
        for pid in processes_with_env(&conf) {
            crate::signal(pid, libc::SIGKILL);
        }
        for (_, child) in self.daemons.iter_mut().rev() {
            crate::signal(child.id(), libc::SIGTERM);
            let stop = Instant::now() + Duration::from_secs(10);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < stop {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The processes whose environment holds `entry` (`NAME=value`).
fn processes_with_env(entry: &str) -> Vec<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|kv| kv == entry.as_bytes()))
        })
        .collect()
}

/// `slurm.conf` for one node on this machine, everything under `dir`.
fn config(dir: &Path) -> String {
    let host = hostname();
    let at = |name: &str| dir.join(name).display().to_string();
    // More CPUs than the machine has (config_overrides): the tests run several small jobs
    // at once. proctrack/linuxproc signals every process a job's tasks started, as the cgroup
    // tracking of most clusters does (proctrack/pgid would miss the ranks that mpirun's
    // daemons put in process groups of their own).
    format!(
        "ClusterName=ddltest\n\
         SlurmctldHost={host}(127.0.0.1)\n\
         SlurmctldPort={}\n\
         SlurmdPort={}\n\
         AuthType=auth/munge\n\
         CredType=cred/munge\n\
         AuthInfo=socket={}\n\
         SlurmUser=root\n\
         SlurmdUser=root\n\
         StateSaveLocation={}\n\
         SlurmdSpoolDir={}\n\
         SlurmctldPidFile={}\n\
         SlurmdPidFile={}\n\
         SlurmctldLogFile={}\n\
         SlurmdLogFile={}\n\
         PlugStackConfig={}\n\
         ProctrackType=proctrack/linuxproc\n\
         TaskPlugin=task/none\n\
         MpiDefault=none\n\
         SelectType=select/cons_tres\n\
         SelectTypeParameters=CR_Core\n\
         SchedulerType=sched/builtin\n\
         KillWait={KILL_WAIT_S}\n\
         ReturnToService=2\n\
         MailProg=/bin/true\n\
         JobCompType=jobcomp/none\n\
         AccountingStorageType=accounting_storage/none\n\
         JobAcctGatherType=jobacct_gather/none\n\
         SlurmdParameters=config_overrides\n\
         NodeName={NODE} NodeHostname={host} NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN\n\
         PartitionName=ddl Nodes={NODE} Default=YES MaxTime=INFINITE State=UP\n",
        free_port(),
        free_port(),
        at("munge.socket"),
        at("state"),
        at("spool"),
        at("slurmctld.pid"),
        at("slurmd.pid"),
        at("slurmctld.log"),
        at("slurmd.log"),
        at("plugstack.conf"),
    )
}

/// This machine's short host name (slurmctld checks that it is `SlurmctldHost`).
fn hostname() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("the host name");
    name.trim()
        .split('.')
        .next()
        .unwrap_or_default()
        .to_string()
}

/// A TCP port free now on 127.0.0.1.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

/// `program` on `PATH`.
fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}
