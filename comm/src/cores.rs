//! The cores the ranks of one node may run on together, to tell whether they share cores.
//!
//! A rank's own affinity mask is not enough: mpirun binds each rank to one core by default
//! when a node runs two ranks or fewer (Open MPI), so every rank sees one core
//! (`available_parallelism` says 1) although each owns a core of its own. Taking that for
//! oversubscription made the waiting ranks sleep between polls, and the message algorithms
//! ran many times slower (BENCHMARKS.md, "On a quiet 16-core machine, and the polling bug it
//! showed"). The ranks pool their masks instead.

use crate::collective::allgather_bytes;
use crate::error::Result;
use crate::transport::Transport;

/// The calling thread's CPU affinity mask, one bit per CPU (bit `c % 8` of byte `c / 8`);
/// the first `available_parallelism` CPUs if the kernel does not say.
pub fn affinity_mask() -> Vec<u8> {
    let cpus = libc::CPU_SETSIZE as usize;
    // SAFETY: cpu_set_t is plain bits, all-zero is the empty set, and sched_getaffinity writes
    // at most size_of::<cpu_set_t>() bytes into it.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        (libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0)
            .then_some(set)
    };
    let allowed = |c: usize| match &set {
        // SAFETY: c < CPU_SETSIZE.
        Some(set) => unsafe { libc::CPU_ISSET(c, set) },
        None => c < std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    (0..cpus / 8)
        .map(|byte| (0..8).fold(0u8, |b, bit| b | (u8::from(allowed(byte * 8 + bit)) << bit)))
        .collect()
}

/// The CPUs in `mask` (at least 1).
fn count(mask: &[u8]) -> usize {
    mask.iter()
        .map(|b| b.count_ones() as usize)
        .sum::<usize>()
        .max(1)
}

/// The CPUs the calling thread may run on, in increasing order.
pub fn allowed_cpus() -> Vec<usize> {
    let mask = affinity_mask();
    (0..mask.len() * 8)
        .filter(|c| mask[c / 8] >> (c % 8) & 1 == 1)
        .collect()
}

/// How many CPUs the calling thread may run on (its affinity mask).
pub fn own_cpus() -> usize {
    count(&affinity_mask())
}

/// Restricts the calling thread, and what it starts from then on, to `cpu`.
pub fn pin_thread(cpu: usize) -> std::io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: a zeroed cpu_set_t is the empty set; cpu < CPU_SETSIZE.
    let ok = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    };
    if ok {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// How many CPUs the machine has online, whatever this process may run on.
pub fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(0).max(own_cpus())
}

/// Collective over the ranks of one node: how many distinct CPUs they may run on together
/// (the union of their affinity masks, at least 1).
pub fn node_cores(node: &dyn Transport) -> Result<usize> {
    let masks = allgather_bytes(node, affinity_mask())?;
    let mut union = vec![0u8; masks.iter().map(Vec::len).max().unwrap_or(0)];
    for mask in &masks {
        for (u, b) in union.iter_mut().zip(mask) {
            *u |= b;
        }
    }
    Ok(count(&union))
}

/// Collective over the ranks of one node: whether they outnumber the CPUs they may run on
/// together, so that a waiting rank should give its core away rather than spin.
pub fn oversubscribed(node: &dyn Transport) -> Result<bool> {
    Ok(node.size() > node_cores(node)?)
}

/// What compute threads on cores they share with the communication (CPU replicas, the
/// calibration's stand-ins for them) add to their nice value: at +10 the scheduler weighs a
/// communication thread about 10 times a compute thread, so that it gets a core as soon as its
/// data arrives.
pub const COMPUTE_NICE: i32 = 10;

/// The calling thread's id and nice value (Linux keeps one per thread).
fn thread_nice() -> std::io::Result<(libc::id_t, i32)> {
    // SAFETY (the libc calls): this thread's id and errno; no memory of ours is touched.
    let tid = unsafe { libc::gettid() };
    let id = libc::id_t::try_from(tid).map_err(std::io::Error::other)?;
    // getpriority may return -1 as a nice value: errno, cleared first, tells an error.
    unsafe { *libc::__errno_location() = 0 };
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, id) };
    let error = std::io::Error::last_os_error();
    if nice == -1 && error.raw_os_error() != Some(0) {
        return Err(error);
    }
    Ok((id, nice))
}

/// Adds `by` to the calling thread's nice value, at most 19.
pub fn lower_thread_priority(by: i32) -> std::io::Result<()> {
    let (id, nice) = thread_nice()?;
    // SAFETY: setpriority on this thread's id; no memory is touched.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, id, (nice + by).min(19)) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::thread::thread_group;

    /// Pins the calling thread to `cpu`.
    fn pin(cpu: usize) {
        pin_thread(cpu).unwrap_or_else(|e| panic!("pinning to CPU {cpu}: {e}"));
    }

    /// `node_cores` on an in-process group whose rank r first pins its thread to
    /// `cpus[r]`.
    fn node_cores_pinned(cpus: &[usize]) -> Vec<usize> {
        let group = thread_group(cpus.len());
        std::thread::scope(|s| {
            let handles: Vec<_> = group
                .iter()
                .zip(cpus)
                .map(|(t, &cpu)| {
                    s.spawn(move || {
                        pin(cpu);
                        assert_eq!(allowed_cpus(), vec![cpu]);
                        node_cores(t).unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn ranks_pinned_to_their_own_cores_count_them_all() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty(), "this thread may run on no CPU?");
        let own: Vec<usize> = cpus.iter().copied().take(4).collect();
        assert_eq!(node_cores_pinned(&own), vec![own.len(); own.len()]);
    }

    #[test]
    fn ranks_pinned_to_one_core_share_it() {
        let cpu = allowed_cpus()[0];
        assert_eq!(node_cores_pinned(&[cpu, cpu, cpu]), vec![1, 1, 1]);
        let group = thread_group(3);
        let verdicts: Vec<bool> = std::thread::scope(|s| {
            let handles: Vec<_> = group
                .iter()
                .map(|t| {
                    s.spawn(move || {
                        pin(cpu);
                        oversubscribed(t).unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(verdicts, vec![true; 3]);
    }

    #[test]
    fn a_pinned_thread_owns_one_cpu_of_those_online() {
        let cpu = allowed_cpus()[0];
        let (own, online) = std::thread::spawn(move || {
            pin(cpu);
            (own_cpus(), online_cpus())
        })
        .join()
        .unwrap();
        assert_eq!(own, 1);
        assert!(online >= allowed_cpus().len(), "{online}");
    }

    #[test]
    fn an_unpinned_thread_sees_every_cpu_it_may_use() {
        let cpus = allowed_cpus();
        let parallelism = std::thread::available_parallelism().unwrap().get();
        // available_parallelism also honours a cgroup CPU quota, which the mask does not.
        assert!(cpus.len() >= parallelism, "{cpus:?} vs {parallelism}");
    }

    fn nice_of_this_thread() -> i32 {
        thread_nice().unwrap().1
    }

    #[test]
    fn a_thread_lowers_its_own_priority_only() {
        let before = nice_of_this_thread();
        let (inside, after) = std::thread::spawn(move || {
            let start = nice_of_this_thread();
            lower_thread_priority(3).unwrap();
            (start, nice_of_this_thread())
        })
        .join()
        .unwrap();
        assert_eq!(after, (inside + 3).min(19));
        assert_eq!(nice_of_this_thread(), before);
    }
}
