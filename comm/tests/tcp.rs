//! The TCP transport (no MPI launcher): every allreduce algorithm, the sharded collectives and
//! the allreduce call check over loopback connections between in-process ranks, plus the
//! failures it must name (a silent rank, a rank that went away, a rank of another job size),
//! and the strangers it must drop while the job starts anyway (garbage, silence, a forged
//! greeting, a rank without the job's secret).

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ddl_comm::{
    tcp_group_with_timeout, Algorithm, Allreducer, CommError, CostModel, Listener, Multicolor,
    Parts, Reduce, Secret, ShardAlgorithm, Sharded, TcpTransport, TcpWorld, Topology, Transport,
};
use half::f16;

use crate::common;
use common::{algorithms, input, on_group, on_tcp_ranks};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Two ranks per node where `p` allows it, as the thread tests lay them out.
fn topology(p: usize, algo: &Algorithm) -> Topology {
    match algo {
        Algorithm::Shm { .. } => Topology::flat(p),
        _ if p % 2 == 0 && p > 2 => Topology::new(p / 2, 2),
        _ => Topology::flat(p),
    }
}

#[test]
fn every_algorithm_sums_exactly_over_tcp() {
    for p in [1, 2, 3, 4, 6] {
        for algo in algorithms(p) {
            let topo = topology(p, &algo);
            // 30,001 f32 in one message of the default algorithms: beyond the frames that
            // go out with their header in one write.
            let big = if matches!(
                algo,
                Algorithm::Multicolor(Multicolor {
                    chunk_bytes: 16,
                    ..
                })
            ) {
                1301
            } else {
                30_001
            };
            let lens = [0, 1, 2 * p + 1, 97, big];
            let a = algo.clone();
            let res = on_tcp_ranks(p, move |r, t| {
                let ar = Allreducer::new(t, a.clone(), topo).expect("allreducer");
                lens.iter()
                    .enumerate()
                    .map(|(k, &len)| {
                        let mut buf = input(r, len, k as u64, true);
                        ar.allreduce_f32(&mut buf, false).expect("allreduce");
                        buf
                    })
                    .collect::<Vec<_>>()
            });
            for (k, &len) in lens.iter().enumerate() {
                let inputs: Vec<Vec<f32>> = (0..p).map(|r| input(r, len, k as u64, true)).collect();
                let expected: Vec<f32> = (0..len)
                    .map(|i| inputs.iter().map(|v| v[i]).sum())
                    .collect();
                for (r, got) in res.iter().enumerate() {
                    assert_eq!(
                        bits(&got[k]),
                        bits(&expected),
                        "{algo} p={p} len={len} rank {r}"
                    );
                }
            }
        }
    }
}

#[test]
fn half_precision_travels_over_tcp() {
    let p = 3;
    let len = 1001;
    let res = on_tcp_ranks(p, move |r, t| {
        let ar = Allreducer::new(t, Algorithm::Ring, Topology::flat(p)).expect("allreducer");
        let mut h: Vec<f16> = input(r, len, 5, true)
            .iter()
            .map(|&v| f16::from_f32(v / 2.0))
            .collect();
        ar.allreduce_f16(&mut h, false).expect("f16");
        h
    });
    for i in 0..len {
        let sum: f32 = (0..p)
            .map(|r| f16::from_f32(input(r, len, 5, true)[i] / 2.0).to_f32())
            .sum();
        for h in &res {
            assert_eq!(h[i], f16::from_f32(sum), "element {i}");
        }
    }
}

#[test]
fn sharded_collectives_are_exact_over_tcp() {
    let p = 4;
    let parts = Parts::from_counts(&[3, 0, 10, 7]);
    let len = parts.len();
    for algo in [
        ShardAlgorithm::Ring,
        ShardAlgorithm::SHM,
        ShardAlgorithm::Auto,
    ] {
        let (pa, a) = (parts.clone(), algo.clone());
        let res = on_tcp_ranks(p, move |r, t| {
            let s = Sharded::new(t, a.clone(), Topology::flat(p), CostModel::default())
                .expect("sharded");
            let mut gathered = vec![f32::NAN; len];
            let mine = pa.range(r);
            gathered[mine.clone()].copy_from_slice(&input(r, len, 3, true)[mine.clone()]);
            s.all_gather(&mut gathered, &pa).expect("allgather");
            let mut summed = input(r, len, 3, true);
            s.reduce_scatter(&mut summed, &pa, Reduce::Sum)
                .expect("sum");
            (gathered, summed[mine].to_vec())
        });
        let inputs: Vec<Vec<f32>> = (0..p).map(|r| input(r, len, 3, true)).collect();
        let owner = |i: usize| {
            (0..p)
                .find(|&q| parts.range(q).contains(&i))
                .expect("owned")
        };
        let concatenated: Vec<f32> = (0..len).map(|i| inputs[owner(i)][i]).collect();
        let sum: Vec<f32> = (0..len)
            .map(|i| inputs.iter().map(|v| v[i]).sum())
            .collect();
        for (r, (gathered, summed)) in res.iter().enumerate() {
            assert_eq!(
                bits(gathered),
                bits(&concatenated),
                "{algo:?} rank {r}: allgather"
            );
            assert_eq!(
                bits(summed),
                bits(&sum[parts.range(r)]),
                "{algo:?} rank {r}: sum"
            );
        }
    }
}

#[test]
fn mismatched_calls_fail_on_every_rank_over_tcp() {
    let group = tcp_group_with_timeout(3, Duration::from_secs(20)).expect("group");
    let res = on_group(group, |r, t| {
        let ar = Allreducer::new(t, Algorithm::Ring, Topology::flat(3)).expect("allreducer");
        let mut buf = input(r, if r == 1 { 10 } else { 12 }, 1, true);
        ar.allreduce_f32(&mut buf, false)
    });
    for (r, result) in res.into_iter().enumerate() {
        match result {
            Err(CommError::Mismatch { rank, calls }) => {
                assert_eq!(rank, r);
                assert_eq!(calls.len(), 3, "rank {r}: one call per rank");
            }
            other => panic!("rank {r}: expected a mismatch, got {other:?}"),
        }
    }
}

#[test]
fn a_silent_rank_is_named_within_the_timeout() {
    let timeout = Duration::from_millis(500);
    let mut group = tcp_group_with_timeout(2, timeout).expect("group");
    let silent = group.pop().expect("rank 1");
    let me = group.pop().expect("rank 0");
    let start = Instant::now();
    let err = me
        .recv(1, 5, &mut [0u8; 4])
        .expect_err("rank 1 never sends");
    assert!(start.elapsed() < 10 * timeout, "took {:?}", start.elapsed());
    assert!(
        matches!(
            err,
            CommError::Timeout {
                op: "recv",
                rank: 0,
                peer: Some(1),
                ..
            }
        ),
        "{err}"
    );
    drop(silent);
}

#[test]
fn a_rank_that_went_away_is_named_at_once() {
    let mut group = tcp_group_with_timeout(3, Duration::from_secs(60)).expect("group");
    drop(group.pop());
    let start = Instant::now();
    let err = group[0]
        .recv(2, 5, &mut [0u8; 4])
        .expect_err("rank 2 is gone");
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "took {:?}",
        start.elapsed()
    );
    assert!(
        matches!(
            err,
            CommError::Disconnected {
                rank: 0,
                peer: 2,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn split_groups_share_the_connections_without_meeting() {
    let res = on_tcp_ranks(4, |r, t| {
        let half = t.split(r % 2, r).expect("split");
        // The same tag in the world and in both halves at once.
        let world_ar =
            Allreducer::new(Arc::clone(&t), Algorithm::Ring, Topology::flat(4)).expect("world");
        let half_ar =
            Allreducer::new(Arc::from(half), Algorithm::Ring, Topology::flat(2)).expect("half");
        let mut a = vec![r as f32 + 1.0; 33];
        let mut b = vec![10.0 * (r as f32 + 1.0); 33];
        half_ar
            .allreduce_f32(&mut b, false)
            .expect("half allreduce");
        world_ar
            .allreduce_f32(&mut a, false)
            .expect("world allreduce");
        t.barrier().expect("barrier");
        (a[0], b[0])
    });
    assert_eq!(
        res,
        vec![(10.0, 40.0), (10.0, 60.0), (10.0, 40.0), (10.0, 60.0)]
    );
}

#[test]
fn a_duplicate_group_never_takes_the_worlds_messages() {
    let res = on_tcp_ranks(2, |r, t| {
        let dup = t.split(0, r).expect("split");
        if r == 0 {
            t.send(1, 7, b"world").expect("send");
            dup.send(1, 7, b"dup").expect("send");
            (Vec::new(), Vec::new())
        } else {
            let (mut a, mut b) = (vec![0u8; 3], vec![0u8; 5]);
            dup.recv(0, 7, &mut a).expect("dup's message");
            t.recv(0, 7, &mut b).expect("world's message");
            (a, b)
        }
    });
    assert_eq!(res[1], (b"dup".to_vec(), b"world".to_vec()));
}

#[test]
fn a_rank_of_another_job_size_is_refused_by_name() {
    let l0 = Listener::bind("127.0.0.1").expect("bind");
    let l1 = Listener::bind("127.0.0.1").expect("bind");
    let (a0, a1) = (
        l0.local_addr().expect("addr"),
        l1.local_addr().expect("addr"),
    );
    let stray = Listener::bind("127.0.0.1")
        .expect("bind")
        .local_addr()
        .expect("addr");
    let timeout = Duration::from_secs(2);
    let secret = Secret::random().expect("secret");
    let s1 = secret.clone();
    let t0 = std::thread::spawn(move || TcpTransport::connect(l0, 0, &[a0, a1], &secret, timeout));
    // Rank 1 believes the job has three ranks.
    let t1 =
        std::thread::spawn(move || TcpTransport::connect(l1, 1, &[a0, a1, stray], &s1, timeout));
    let err = t0.join().expect("rank 0").expect_err("refused");
    assert!(
        err.to_string()
            .contains("rank 1 connected saying the job has 3 ranks"),
        "{err}"
    );
    let _ = t1.join();
}

#[test]
fn the_world_finds_its_nodes_from_their_names() {
    let listeners: Vec<Listener> = (0..4)
        .map(|_| Listener::bind("127.0.0.1").expect("bind"))
        .collect();
    let addrs: Vec<_> = listeners
        .iter()
        .map(|l| l.local_addr().expect("addr"))
        .collect();
    let secret = Secret::random().expect("secret");
    let handles: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(r, l)| {
            let (addrs, secret) = (addrs.clone(), secret.clone());
            std::thread::spawn(move || {
                let node = if r < 2 { "n0" } else { "n1" };
                let timeout = Duration::from_secs(20);
                let w = TcpWorld::connect(l, r, &addrs, &secret, node, timeout).expect("world");
                let ar =
                    Allreducer::new(w.transport(), Algorithm::Auto, w.topology()).expect("auto");
                let mut buf = vec![1.0f32; 1000];
                ar.allreduce_f32(&mut buf, false).expect("allreduce");
                (
                    w.node_index(),
                    w.node_count(),
                    w.local_rank(),
                    w.local_size(),
                    w.topology(),
                    buf[999],
                )
            })
        })
        .collect();
    let got: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().expect("rank"))
        .collect();
    for (r, g) in got.iter().enumerate() {
        assert_eq!((g.0, g.1, g.2, g.3), (r / 2, 2, r % 2, 2), "rank {r}");
        assert_eq!(g.4, Topology::new(2, 2), "rank {r}");
        assert_eq!(g.5, 4.0, "rank {r}");
    }
}

/// Operation timeout of the start-up tests: a rank that is held up fails within it.
const START: Duration = Duration::from_secs(20);

/// Listeners of a job of `n` ranks over loopback, and their addresses.
fn listeners(n: usize) -> (Vec<Listener>, Vec<SocketAddr>) {
    let ls: Vec<Listener> = (0..n)
        .map(|_| Listener::bind("127.0.0.1").expect("bind"))
        .collect();
    let addrs = ls.iter().map(|l| l.local_addr().expect("addr")).collect();
    (ls, addrs)
}

/// Rank `r` of the job at `addrs` on a thread of its own: connects holding `secret`, then
/// sums `r + 1` over the ranks.
fn rank_summing(
    l: Listener,
    r: usize,
    addrs: &[SocketAddr],
    secret: &Secret,
) -> JoinHandle<Result<f32, CommError>> {
    let (addrs, secret) = (addrs.to_vec(), secret.clone());
    std::thread::spawn(move || {
        let t = TcpTransport::connect(l, r, &addrs, &secret, START)?;
        let ar = Allreducer::new(Arc::new(t), Algorithm::Ring, Topology::flat(addrs.len()))?;
        let mut buf = vec![r as f32 + 1.0; 5];
        ar.allreduce_f32(&mut buf, false)?;
        Ok(buf[4])
    })
}

/// Starts the ranks of `ls` and checks that each ends with the sum 1 + 2 + ... + n, within
/// half the operation timeout (no stranger held a rank up).
fn starts_and_sums(ls: Vec<Listener>, addrs: &[SocketAddr], secret: &Secret) {
    let begun = Instant::now();
    let ranks: Vec<_> = ls
        .into_iter()
        .enumerate()
        .map(|(r, l)| rank_summing(l, r, addrs, secret))
        .collect();
    let n = addrs.len();
    for (r, h) in ranks.into_iter().enumerate() {
        let sum = h.join().expect("rank thread");
        assert_eq!(
            sum.expect("the job starts"),
            (n * (n + 1) / 2) as f32,
            "rank {r}"
        );
    }
    assert!(begun.elapsed() < START / 2, "took {:?}", begun.elapsed());
}

/// A connection to `addr` that has sent `bytes` (queued before the rank accepts it).
fn stranger(addr: SocketAddr, bytes: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect to a listener");
    s.write_all(bytes).expect("send");
    s
}

#[test]
fn a_stranger_sending_garbage_is_dropped_and_the_job_starts() {
    let (ls, addrs) = listeners(3);
    let http = b"GET / HTTP/1.1\r\nHost: ddl\r\n\r\n";
    let noise: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let _held = [stranger(addrs[0], http), stranger(addrs[1], &noise)];
    starts_and_sums(ls, &addrs, &Secret::random().expect("secret"));
}

#[test]
fn a_silent_stranger_neither_holds_up_nor_stops_the_start() {
    let (ls, addrs) = listeners(3);
    // Connected first, silent while the ranks start (before: rank 0 waited the whole timeout).
    let _held = [stranger(addrs[0], &[]), stranger(addrs[1], &[])];
    starts_and_sums(ls, &addrs, &Secret::random().expect("secret"));
}

#[test]
fn a_forged_greeting_is_dropped_and_the_job_starts() {
    let (ls, addrs) = listeners(3);
    let words = |w: [&[u8]; 3]| w.concat();
    // The unauthenticated greeting that made a stranger rank 1 before.
    let old = words([b"ddl-tcp1", &1u64.to_le_bytes(), &3u64.to_le_bytes()]);
    // Today's greeting of rank 2 with a proof made without the secret.
    let zeros = [0u8; 64];
    let forged = words([b"ddl-tcp2", &2u64.to_le_bytes(), &3u64.to_le_bytes()]);
    let forged = [forged.as_slice(), &zeros].concat();
    let _held = [stranger(addrs[0], &old), stranger(addrs[1], &forged)];
    starts_and_sums(ls, &addrs, &Secret::random().expect("secret"));
}

#[test]
fn a_rank_without_the_jobs_secret_is_dropped_and_the_job_starts() {
    let (mut ls, addrs) = listeners(2);
    let l1 = ls.pop().expect("rank 1's listener");
    let l0 = ls.pop().expect("rank 0's listener");
    let secret = Secret::random().expect("secret");
    let rank0 = rank_summing(l0, 0, &addrs, &secret);
    // A well-formed rank 1 holding another secret dials rank 0 until its own timeout.
    let (stray, stray_addr) = listeners(1);
    let stray_l = stray.into_iter().next().expect("listener");
    let other = Secret::random().expect("secret");
    let timeout = Duration::from_millis(800);
    let refused = TcpTransport::connect(stray_l, 1, &[addrs[0], stray_addr[0]], &other, timeout)
        .expect_err("rank 0 drops it");
    assert!(
        refused.to_string().contains("no handshake with") && refused.to_string().contains("secret"),
        "{refused}"
    );
    // Then the real rank 1 joins rank 0, which is still accepting.
    let rank1 = rank_summing(l1, 1, &addrs, &secret);
    assert_eq!(rank0.join().expect("rank 0").expect("rank 0 starts"), 3.0);
    assert_eq!(rank1.join().expect("rank 1").expect("rank 1 starts"), 3.0);
}

#[test]
fn a_listener_that_does_not_prove_the_secret_is_refused_by_the_rank_calling_it() {
    // Published as rank 0's: it challenges as a rank would, then answers any greeting with
    // bytes that are no proof (it does not hold the job's secret).
    let impostor = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let at = impostor.local_addr().expect("addr");
    let answering = std::thread::spawn(move || {
        let (mut s, _) = impostor.accept().expect("rank 1 calls");
        s.write_all(&[b"ddl-tcp2".as_slice(), &[9; 32]].concat())
            .expect("challenge");
        s.read_exact(&mut [0u8; 88]).expect("rank 1's greeting");
        s.write_all(&[0u8; 32]).expect("answer");
        s
    });
    let (mut ls, addrs) = listeners(2);
    let l1 = ls.pop().expect("rank 1's listener");
    let secret = Secret::random().expect("secret");
    let err = TcpTransport::connect(l1, 1, &[at, addrs[1]], &secret, START)
        .expect_err("rank 1 refuses the impostor");
    let _ = answering.join();
    let said = err.to_string();
    assert!(
        said.contains(&format!(
            "the listener at {at}, published as rank 0's, is refused"
        )) && said.contains("its answer does not prove that it holds the job's secret"),
        "{said}"
    );
}

#[test]
fn the_listener_is_closed_once_the_mesh_is_connected() {
    let (ls, addrs) = listeners(2);
    let secret = Secret::random().expect("secret");
    let connecting: Vec<_> = ls
        .into_iter()
        .enumerate()
        .map(|(r, l)| {
            let (addrs, secret) = (addrs.clone(), secret.clone());
            std::thread::spawn(move || TcpTransport::connect(l, r, &addrs, &secret, START))
        })
        .collect();
    let ranks: Vec<TcpTransport> = connecting
        .into_iter()
        .map(|h| h.join().expect("rank thread").expect("connected"))
        .collect();
    // The job runs on; nobody can connect to its ranks any more.
    for (r, addr) in addrs.iter().enumerate() {
        let err = TcpStream::connect(addr).expect_err("nobody listens any more");
        assert_eq!(
            err.kind(),
            std::io::ErrorKind::ConnectionRefused,
            "rank {r} at {addr}"
        );
    }
    let sums = on_group(ranks, |r, t| {
        let ar = Allreducer::new(t, Algorithm::Ring, Topology::flat(2)).expect("allreducer");
        let mut buf = vec![r as f32 + 1.0; 3];
        ar.allreduce_f32(&mut buf, false).expect("allreduce");
        buf[2]
    });
    assert_eq!(sums, vec![3.0, 3.0]);
}

/// A connection to `to` from `source` (an address of this machine: any of 127.0.0.0/8 on
/// Linux), as a host elsewhere would make it.
fn connect_from(source: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    use std::os::fd::FromRawFd;
    let inet = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    let SocketAddr::V4(to) = to else {
        return Err(std::io::Error::other("an IPv4 listener"));
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a new socket, owned by the TcpStream once connected (closed here otherwise);
    // the addresses are sockaddr_in of `len` bytes.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let stream = TcpStream::from_raw_fd(fd);
        let (here, there) = (inet(source, 0), inet(*to.ip(), to.port()));
        let bound = libc::bind(fd, (&here as *const libc::sockaddr_in).cast(), len);
        if bound != 0 || libc::connect(fd, (&there as *const libc::sockaddr_in).cast(), len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stream)
    }
}

/// `n` strangers at `to` from `source`, each silent, each connecting again as soon as the
/// listener drops it, until `stop`; `made` counts their connections.
fn flood(
    to: SocketAddr,
    source: Ipv4Addr,
    n: usize,
    stop: &Arc<AtomicBool>,
    made: &Arc<AtomicU64>,
) -> Vec<JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let (stop, made) = (Arc::clone(stop), Arc::clone(made));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut s) = connect_from(source, to) else {
                        std::thread::yield_now();
                        continue;
                    };
                    made.fetch_add(1, Ordering::Relaxed);
                    let _ = s.set_read_timeout(Some(Duration::from_millis(20)));
                    let mut buf = [0u8; 64];
                    // Silent: reads what the rank says until it drops the connection.
                    while !stop.load(Ordering::Relaxed) {
                        match s.read(&mut buf) {
                            Ok(0) => break,
                            Ok(_) => {}
                            Err(e)
                                if matches!(
                                    e.kind(),
                                    ErrorKind::WouldBlock | ErrorKind::TimedOut
                                ) => {}
                            Err(_) => break,
                        }
                    }
                }
            })
        })
        .collect()
}

/// Set in the process of its own that the flood test runs its job in (the parent counts the
/// lines its stderr gets).
const FLOODED: &str = "DDL_TEST_TCP_FLOODED";

/// Most warning lines a flooded start may write.
const FLOOD_LINES: usize = 30;

#[test]
fn a_flood_of_strangers_neither_holds_up_the_start_nor_fills_the_log() {
    if std::env::var_os(FLOODED).is_none() {
        let name = "tcp::a_flood_of_strangers_neither_holds_up_the_start_nor_fills_the_log";
        let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", name, "--nocapture", "--test-threads", "1"])
            .env(FLOODED, "1")
            .output()
            .expect("run the test binary");
        let printed = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && printed.contains("1 passed"),
            "{printed}"
        );
        let warnings = printed
            .lines()
            .filter(|l| l.starts_with("ddl warning"))
            .count();
        let tail: Vec<&str> = printed.lines().rev().take(20).collect();
        assert!(
            warnings <= FLOOD_LINES,
            "{warnings} warning lines, the last: {tail:#?}"
        );
        return;
    }
    let secret = Secret::random().expect("secret");
    let (ls, addrs) = listeners(3);
    let begun = Instant::now();
    starts_and_sums(ls, &addrs, &secret);
    let normal = begun.elapsed();
    // The flood at rank 0 (80 silent connections from the ranks' own host, each
    // opened again once dropped) and 60 more from a host elsewhere, while ranks 0 and 1 wait
    // for rank 2, which starts once each of the 80 was dropped at least once.
    let (ls, addrs) = listeners(3);
    let stop = Arc::new(AtomicBool::new(false));
    let (local, elsewhere) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut strangers = flood(addrs[0], Ipv4Addr::LOCALHOST, 80, &stop, &local);
    let host_elsewhere = Ipv4Addr::new(127, 0, 0, 2);
    strangers.extend(flood(addrs[0], host_elsewhere, 60, &stop, &elsewhere));
    let mut ls = ls.into_iter();
    let early: Vec<_> = (0..2)
        .map(|r| rank_summing(ls.next().expect("listener"), r, &addrs, &secret))
        .collect();
    let deadline = Instant::now() + START;
    while local.load(Ordering::Relaxed) < 2 * 80 && Instant::now() < deadline {
        std::thread::yield_now();
    }
    let begun = Instant::now();
    let last = rank_summing(ls.next().expect("listener"), 2, &addrs, &secret);
    for (r, rank) in early.into_iter().chain([last]).enumerate() {
        let sum = rank.join().expect("rank thread").expect("the job starts");
        assert_eq!(sum, 6.0, "rank {r}");
    }
    let flooded = begun.elapsed();
    stop.store(true, Ordering::Relaxed);
    for s in strangers {
        s.join().expect("stranger");
    }
    let made = local.load(Ordering::Relaxed) + elsewhere.load(Ordering::Relaxed);
    println!("start: {normal:?} alone, {flooded:?} for the last rank under a flood of {made} connections");
    assert!(
        flooded < normal + Duration::from_secs(3),
        "{flooded:?} flooded, {normal:?} alone"
    );
}
