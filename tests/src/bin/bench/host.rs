//! What the bench reads off the machine and its processes (Linux /proc):
//! the machine line printed above every run, CPU seconds of a process,
//! which process listens on a peer's port, and whether the sockets a relay
//! accepted have `TCP_NODELAY` set (read from the relay's own file
//! descriptors, so a preload shim that did not take is seen, not assumed).

use std::io::Write;
use std::time::Instant;

/// CPU seconds (user + system) used so far by process `pid` (all its
/// threads), with `children` also its exited children and its live child
/// processes (a PostgreSQL server: the postmaster and its backends).
pub fn cpu_secs(pid: u32, children: bool) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let Some((_, [ut, st, cut, cst])) = stat_fields(&pid.to_string()) else {
        return 0.0;
    };
    let mut total = ut + st;
    if children {
        total += cut + cst;
        for name in proc_pids() {
            if let Some((ppid, [ut, st, _, _])) = stat_fields(&name) {
                if ppid == pid {
                    total += ut + st;
                }
            }
        }
    }
    total as f64 / ticks
}

/// `(ppid, [utime, stime, cutime, cstime])` of `/proc/<pid>/stat`.
fn stat_fields(pid: &str) -> Option<(u32, [u64; 4])> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name: state ppid ... utime(12) stime(13)
    // cutime(14) cstime(15), 1-based from the state field.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Some((n(1) as u32, [n(11), n(12), n(13), n(14)]))
}

fn proc_pids() -> impl Iterator<Item = String> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
}

/// The machine line: CPU model, cores, kernel, and the rate of synchronous
/// 4 KiB writes in `dir` (what `dd bs=4k oflag=dsync` measures: the cost of
/// a commit that reaches the disk), so that figures from two machines are
/// not compared as if they were one.
pub fn machine_line(dir: &std::path::Path) -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')))
        .map_or("unknown CPU".to_string(), |(_, m)| m.trim().to_string());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let dsync = match dsync_rate(dir) {
        Ok(mb_per_s) => format!("{mb_per_s:.1} MB/s"),
        Err(e) => format!("not measured ({e})"),
    };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    format!(
        "machine: {model}, {cores} cores, Linux {}, load average {} (1, 5, 15 min), synchronous 4 KiB writes {dsync} (as dd bs=4k count={DSYNC_WRITES} oflag=dsync in {})",
        kernel.trim(),
        load.join(" "),
        dir.display()
    )
}

/// Writes of the dsync measurement: 10 MB, about a second on a slow virtual disk.
const DSYNC_WRITES: usize = 2500;

/// MB per second of 4 KiB writes each synced to the disk (`O_DSYNC`).
fn dsync_rate(dir: &std::path::Path) -> std::io::Result<f64> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(format!("bench-dsync-{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .custom_flags(libc::O_DSYNC)
        .open(&path)?;
    let block = [0u8; 4096];
    let start = Instant::now();
    for _ in 0..DSYNC_WRITES {
        f.write_all(&block)?;
    }
    let secs = start.elapsed().as_secs_f64();
    drop(f);
    let _ = std::fs::remove_file(&path);
    Ok((DSYNC_WRITES * block.len()) as f64 / secs / 1e6)
}

/// One TCP socket of `/proc/net/tcp{,6}`: local port, remote port, state, inode.
struct TcpRow {
    local_port: u16,
    remote_port: u16,
    listening: bool,
    inode: u64,
}

fn tcp_rows() -> Vec<TcpRow> {
    let mut rows = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let port = |addr: &str| {
                addr.rsplit_once(':')
                    .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
            };
            let (Some(local_port), Some(remote_port), Some(state), Some(inode)) = (
                f.get(1).and_then(|a| port(a)),
                f.get(2).and_then(|a| port(a)),
                f.get(3),
                f.get(9).and_then(|i| i.parse().ok()),
            ) else {
                continue;
            };
            // State 0A is LISTEN (include/net/tcp_states.h).
            let listening = *state == "0A";
            rows.push(TcpRow {
                local_port,
                remote_port,
                listening,
                inode,
            });
        }
    }
    rows
}

/// The descriptor numbers of process `pid` that hold socket `inode`.
fn fd_of_inode(pid: u32, inode: u64) -> Option<i32> {
    let want = format!("socket:[{inode}]");
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .flatten()
        .find(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy() == want))
        .and_then(|e| e.file_name().to_str()?.parse().ok())
}

/// The pid of the local process listening on `port`.
pub fn listener_of(port: u16) -> Option<u32> {
    let inodes: Vec<u64> = tcp_rows()
        .into_iter()
        .filter(|r| r.listening && r.local_port == port)
        .map(|r| r.inode)
        .collect();
    proc_pids()
        .filter_map(|name| name.parse().ok())
        .find(|pid| inodes.iter().any(|i| fd_of_inode(*pid, *i).is_some()))
}

/// Of the sockets process `pid` accepted on `server_port` for the clients
/// whose local ports are `client_ports`, how many have `TCP_NODELAY` set:
/// each is duplicated into this process (`pidfd_getfd`, Linux 5.6, needs
/// ptrace rights over `pid`) and asked. `Err` says why it could not be read.
pub fn nodelay_count(pid: u32, server_port: u16, client_ports: &[u16]) -> Result<(usize, usize), String> {
    let rows = tcp_rows();
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) } as i32;
    if pidfd < 0 {
        return Err(format!("pidfd_open: {}", std::io::Error::last_os_error()));
    }
    let mut set = 0;
    let mut result = Ok(());
    for port in client_ports {
        let Some(fd) = rows
            .iter()
            .find(|r| !r.listening && r.local_port == server_port && r.remote_port == *port)
            .and_then(|r| fd_of_inode(pid, r.inode))
        else {
            result = Err(format!("no socket of pid {pid} for client port {port}"));
            break;
        };
        match socket_nodelay(pidfd, fd) {
            Ok(true) => set += 1,
            Ok(false) => {}
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    // SAFETY: pidfd is a descriptor this function opened.
    unsafe { libc::close(pidfd) };
    result.map(|()| (set, client_ports.len()))
}

/// `TCP_NODELAY` of descriptor `fd` of the process behind `pidfd`.
fn socket_nodelay(pidfd: i32, fd: i32) -> Result<bool, String> {
    // SAFETY: pidfd_getfd duplicates another process's descriptor into this
    // one, or returns -1; the copy is closed below.
    let copy = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, fd, 0) } as i32;
    if copy < 0 {
        return Err(format!("pidfd_getfd: {}", std::io::Error::last_os_error()));
    }
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: value and len are valid for writes of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            copy,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    let err = std::io::Error::last_os_error();
    // SAFETY: copy is a descriptor this function owns.
    unsafe { libc::close(copy) };
    if rc != 0 {
        return Err(format!("getsockopt: {err}"));
    }
    Ok(value != 0)
}

/// Whether `pid` has a shared object whose path contains `needle` mapped
/// (the `TCP_NODELAY` preload shim, by its file name).
pub fn maps_contain(pid: u32, needle: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| m.contains(needle))
}
