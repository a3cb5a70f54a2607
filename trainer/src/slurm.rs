//! Slurm: what a job learns from its scheduler about how it will be stopped. Read once at the
//! start with `scontrol` (by rank 0, which shares it, see [`crate::job::Job::slurm`]): how long
//! SIGKILL follows SIGTERM when the job is cancelled, preempted or reaches its time limit
//! (`KillWait`), how much of the time limit is left, and the file the batch job's standard
//! error goes to. Slurm does not tell a job its own `--signal`; a warning signal it asked for
//! arrives as any other SIGTERM. Under Open MPI's `mpirun` inside the job, `mpirun`'s own
//! daemons kill the ranks sooner ([`MpirunKill`]) and no longer forward their output, so the
//! last lines go to the job's output file itself ([`append_line`]).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::signal::KillTiming;

/// What Slurm said about this process's job.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmJob {
    /// `SLURM_JOB_ID`.
    pub id: String,
    /// Seconds from SIGTERM to SIGKILL (`KillWait`), when `scontrol show config` answered.
    pub kill_wait_s: Option<u64>,
    /// The time limit as Slurm prints it (`1-00:00:00`), when the job has one.
    pub time_limit: Option<String>,
    /// Seconds until the time limit (with `OverTimeLimit`) sends its SIGTERM, when asked.
    pub time_left_s: Option<u64>,
    /// The file a batch job's standard error goes to (`StdErr`).
    pub stderr: Option<PathBuf>,
}

impl SlurmJob {
    /// The job this process runs in (`SLURM_JOB_ID`), if any: a job step, a batch shell or an
    /// `mpirun` inside an allocation.
    pub fn id_from_env() -> Option<String> {
        std::env::var("SLURM_JOB_ID")
            .ok()
            .filter(|id| !id.is_empty())
    }

    /// Asks `scontrol` about job `id`. What it cannot learn (no `scontrol` on `PATH`, a
    /// controller that does not answer) stays `None`: the run goes on without it.
    pub fn query(id: &str) -> SlurmJob {
        let job = scontrol(&["show", "job", "-o", id]).unwrap_or_default();
        let config = scontrol(&["show", "config"]).unwrap_or_default();
        SlurmJob::parse(id, &job, &config)
    }

    /// The facts in `scontrol show job -o ID` (`job`) and `scontrol show config` (`config`).
    pub fn parse(id: &str, job: &str, config: &str) -> SlurmJob {
        let field = |key: &str| {
            job.split_whitespace()
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                .filter(|v| !v.is_empty() && *v != "(null)")
        };
        let setting = |key: &str| {
            config.lines().find_map(|l| {
                let (k, v) = l.split_once('=')?;
                (k.trim() == key).then(|| v.trim().to_string())
            })
        };
        let leading_number = |v: String| v.split_whitespace().next()?.parse::<u64>().ok();
        let kill_wait_s = setting("KillWait").and_then(leading_number);
        let over_s = setting("OverTimeLimit")
            .and_then(leading_number)
            .unwrap_or(0)
            * 60;
        let limit = field("TimeLimit").and_then(|t| Some((t, clock_s(t)?)));
        let time_left_s = limit
            .zip(field("RunTime").and_then(clock_s))
            .map(|((_, limit_s), run_s)| (limit_s + over_s).saturating_sub(run_s));
        SlurmJob {
            id: id.to_string(),
            kill_wait_s,
            time_limit: limit.map(|(t, _)| t.to_string()),
            time_left_s,
            stderr: field("StdErr").map(PathBuf::from),
        }
    }

    /// How long a stop has in this job, counted from `asked` (when [`SlurmJob::query`] ran),
    /// for a process that `mpirun` started when `mpirun` is given: the shorter of `KillWait`
    /// and Open MPI's own kill, and the time limit's SIGKILL at the earliest (the limit's
    /// SIGTERM, then that grace).
    pub fn timing(&self, asked: Instant, mpirun: Option<&MpirunKill>) -> KillTiming {
        let kill_wait = self
            .kill_wait_s
            .map(|s| (Duration::from_secs(s), "Slurm's KillWait".to_string()));
        let open_mpi = mpirun.map(|m| (m.grace(), m.describe()));
        let grace = match (kill_wait, open_mpi) {
            (Some(k), Some(m)) => Some(if m.0 < k.0 { m } else { k }),
            (k, m) => k.or(m),
        };
        let kill_by = self
            .time_left_s
            .zip(grace.as_ref())
            .map(|(left, (g, _))| asked + Duration::from_secs(left) + *g);
        let mut said = self.describe();
        if let Some(m) = mpirun {
            said.push_str(&format!(
                "; under mpirun about {} s ({})",
                m.grace().as_secs(),
                m.describe()
            ));
        }
        KillTiming {
            grace,
            kill_by,
            said,
        }
    }

    /// For the start-up line: `Slurm job 42: SIGKILL 60 s after SIGTERM (KillWait), time limit
    /// 01:00:00 (00:59:58 left)`.
    pub fn describe(&self) -> String {
        let mut said = format!("Slurm job {}", self.id);
        match self.kill_wait_s {
            Some(s) => said.push_str(&format!(": SIGKILL {s} s after SIGTERM (KillWait)")),
            None => said.push_str(": KillWait unknown (scontrol did not answer)"),
        }
        if let (Some(limit), Some(left)) = (&self.time_limit, self.time_left_s) {
            said.push_str(&format!(", time limit {limit} ({} left)", clock(left)));
        }
        said
    }
}

/// How Open MPI's `mpirun` (4.x) ends its ranks when Slurm stops the job: its daemons get
/// Slurm's SIGTERM too and kill their ranks a while after it, whatever `KillWait` allows
/// (`odls_base_sigkill_timeout`, default 1 s: SIGTERM after it, SIGKILL after it again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MpirunKill {
    /// `odls_base_sigkill_timeout` in seconds.
    pub timeout_s: u64,
}

impl MpirunKill {
    /// For a process that Open MPI's launcher started (its variables are set before MPI
    /// starts; `srun` sets none of them): the kill its daemons give, from the parameter
    /// `mpirun --mca odls_base_sigkill_timeout N` (or `OMPI_MCA_...`) passes its ranks.
    pub fn from_env() -> Option<MpirunKill> {
        std::env::var_os("OMPI_COMM_WORLD_SIZE")?;
        let timeout_s = std::env::var("OMPI_MCA_odls_base_sigkill_timeout")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(1);
        Some(MpirunKill { timeout_s })
    }

    /// From Slurm's SIGTERM to the daemons' SIGKILL: measured under Slurm 22.05 and Open MPI
    /// 4.1, about twice the timeout less a second (1 s at the default).
    pub fn grace(&self) -> Duration {
        Duration::from_secs((2 * self.timeout_s).saturating_sub(1).max(1))
    }

    fn describe(&self) -> String {
        format!(
            "Open MPI's daemons, odls_base_sigkill_timeout {} s",
            self.timeout_s
        )
    }
}

/// Appends `line` and a newline to `file` (a batch job's output, which Slurm opens for
/// appending): the last lines of ranks that `mpirun` started, whose own output went through
/// daemons that Slurm is stopping as well. Never creates the file (a path of another node).
pub fn append_line(file: &std::path::Path, line: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().append(true).open(file)?;
    f.write_all(format!("{line}\n").as_bytes())
}

/// How long `scontrol` may take (it retries an unreachable controller for longer).
const SCONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// `scontrol ARGS`'s output, if it succeeded within [`SCONTROL_TIMEOUT`] (else it is killed).
fn scontrol(args: &[&str]) -> Option<String> {
    let mut child = Command::new("scontrol")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let stdout = child.stdout.take()?;
    let reader = std::thread::spawn(move || std::io::read_to_string(stdout).ok());
    let deadline = Instant::now() + SCONTROL_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    };
    let text = reader.join().ok()??;
    status.success().then_some(text)
}

/// Seconds of a Slurm duration `[D-]HH:MM:SS` (or `MM:SS`); `None` for `UNLIMITED`,
/// `Partition_Limit` and anything else.
fn clock_s(text: &str) -> Option<u64> {
    let (days, rest) = match text.split_once('-') {
        Some((d, rest)) => (d.parse::<u64>().ok()?, rest),
        None => (0, text),
    };
    let parts: Vec<u64> = rest
        .split(':')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    let hms = match parts[..] {
        [h, m, s] => h * 3600 + m * 60 + s,
        [m, s] => m * 60 + s,
        _ => return None,
    };
    Some(days * 86_400 + hms)
}

/// `seconds` as Slurm prints a duration (`[D-]HH:MM:SS`).
fn clock(seconds: u64) -> String {
    let (d, s) = (seconds / 86_400, seconds % 86_400);
    let hms = format!("{:02}:{:02}:{:02}", s / 3600, s % 3600 / 60, s % 60);
    if d > 0 {
        format!("{d}-{hms}")
    } else {
        hms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `scontrol show job -o` and `scontrol show config` of Slurm 22.05, cut down.
    const JOB: &str = "JobId=42 JobName=train UserId=u(1000) JobState=RUNNING RunTime=00:10:05 \
        TimeLimit=01:00:00 TimeMin=N/A StartTime=2024-05-01T10:00:00 Command=/home/u/job.sh \
        WorkDir=/home/u StdErr=/home/u/slurm-42.out StdIn=/dev/null StdOut=/home/u/slurm-42.out";
    const CONFIG: &str = "Configuration data as of 2024-05-01T10:10:05\n\
        InactiveLimit           = 0 sec\nKillWait                = 30 sec\n\
        OverTimeLimit           = 1 min\nMpiDefault              = pmix\n";

    #[test]
    fn reads_the_kill_wait_the_time_left_and_the_output_file() {
        let job = SlurmJob::parse("42", JOB, CONFIG);
        assert_eq!(job.kill_wait_s, Some(30));
        assert_eq!(job.time_limit.as_deref(), Some("01:00:00"));
        // 3600 s + 60 s of OverTimeLimit - 605 s run.
        assert_eq!(job.time_left_s, Some(3055));
        assert_eq!(job.stderr, Some(PathBuf::from("/home/u/slurm-42.out")));
        assert_eq!(
            job.describe(),
            "Slurm job 42: SIGKILL 30 s after SIGTERM (KillWait), time limit 01:00:00 \
             (00:50:55 left)"
        );
    }

    #[test]
    fn a_job_without_a_limit_or_an_answer_says_what_it_knows() {
        let unlimited = JOB.replace("TimeLimit=01:00:00", "TimeLimit=UNLIMITED");
        let job = SlurmJob::parse("42", &unlimited, "");
        assert_eq!((job.kill_wait_s, job.time_left_s), (None, None));
        assert_eq!(job.time_limit, None);
        assert_eq!(job.timing(Instant::now(), None).kill_by, None);
        assert!(
            job.describe().contains("KillWait unknown"),
            "{}",
            job.describe()
        );
    }

    #[test]
    fn the_grace_is_the_shorter_of_kill_wait_and_open_mpi_s_kill() {
        let job = SlurmJob::parse("42", JOB, CONFIG);
        let now = Instant::now();
        let srun = job.timing(now, None);
        assert_eq!(
            srun.grace,
            Some((Duration::from_secs(30), "Slurm's KillWait".into()))
        );
        assert_eq!(srun.kill_by, Some(now + Duration::from_secs(3055 + 30)));
        let mpirun = job.timing(now, Some(&MpirunKill { timeout_s: 1 }));
        let (grace, from) = mpirun.grace.unwrap();
        assert_eq!(grace, Duration::from_secs(1));
        assert!(from.contains("odls_base_sigkill_timeout 1 s"), "{from}");
        assert!(
            mpirun.said.contains("under mpirun about 1 s"),
            "{}",
            mpirun.said
        );
        let patient = job.timing(now, Some(&MpirunKill { timeout_s: 60 }));
        assert_eq!(patient.grace.unwrap().0, Duration::from_secs(30));
    }

    #[test]
    fn slurm_durations() {
        assert_eq!(clock_s("1-02:03:04"), Some(93_784));
        assert_eq!(clock_s("00:01:00"), Some(60));
        assert_eq!(clock_s("05:30"), Some(330));
        assert_eq!(clock_s("Partition_Limit"), None);
        assert_eq!(clock(93_784), "1-02:03:04");
        assert_eq!(clock(59), "00:00:59");
    }
}
