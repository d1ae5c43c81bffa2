//! Shared helpers for the root integration tests and the benchmark: network namespaces,
//! cgroup subtrees and probe processes (this test binary re-executed in probe mode).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tenancy_network::{counters, CgroupLayout, Dest, FirewallSpec, TenantNet};

pub use tenancy_test_support::requires_root;

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A short unique name: prefix + pid + sequence.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}{}x{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    )
}

pub fn sh(cmd: &str, args: &[&str]) {
    let st = Command::new(cmd)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"));
    assert!(st.success(), "{cmd} {args:?} failed: {st}");
}

/// A network namespace created with `ip netns add`, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(prefix: &str) -> Netns {
        let name = unique(prefix);
        sh("ip", &["netns", "add", &name]);
        let ns = Netns { name };
        sh("ip", &["-n", &ns.name, "link", "set", "lo", "up"]);
        ns
    }
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }
    /// Move the calling thread into this namespace (children it spawns inherit it).
    pub fn enter_thread(&self) {
        let f = std::fs::File::open(self.path()).unwrap();
        // SAFETY: valid fd; CLONE_NEWNET setns affects only the calling thread.
        let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
    }
    /// A veth pair named `prefix` and a unique suffix: its first end here, its peer in `peer`.
    pub fn veth_to(&self, peer: &Netns, prefix: &str) -> (String, String) {
        let (v0, v1) = (unique(prefix), unique(prefix));
        let link = ["link", "add", &v0, "type", "veth", "peer", "name", &v1];
        self.ip(&[&link[..], &["netns", &peer.name]].concat());
        (v0, v1)
    }
    pub fn ip(&self, args: &[&str]) {
        let mut a = vec!["-n", self.name.as_str()];
        a.extend_from_slice(args);
        sh("ip", &a);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Removes a test cgroup subtree (jobs, tenants, subtree) on drop, killing leftovers.
pub struct CgroupTree {
    pub layout: CgroupLayout,
}

impl CgroupTree {
    pub fn new(prefix: &str) -> CgroupTree {
        let base = CgroupLayout::detect("x").expect("cgroup2 layout");
        CgroupTree {
            layout: CgroupLayout {
                subtree: unique(prefix),
                ..base
            },
        }
    }
}

fn rm_cgroup(p: &Path) {
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                rm_cgroup(&e.path());
            }
        }
    }
    let _ = std::fs::write(p.join("cgroup.kill"), "1");
    for _ in 0..200 {
        match std::fs::remove_dir(p) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

impl Drop for CgroupTree {
    fn drop(&mut self) {
        rm_cgroup(&self.layout.subtree_dir());
    }
}

/// Child processes killed and reaped on drop.
#[derive(Default)]
pub struct Procs(pub Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The IP protocol number `raw` datagram probes use (253: for experiments, RFC 3692).
pub const RAW_PROTO: std::num::NonZeroU32 = match std::num::NonZeroU32::new(253) {
    Some(p) => p,
    None => unreachable!(),
};

/// The uid a probe placed in a job cgroup runs as: the job user, but root for raw IP (a job
/// with CAP_NET_RAW: a root job or a container's root).
fn probe_uid(args: &str, cgroup: Option<&Path>) -> Option<u32> {
    if args.split_whitespace().nth(1) == Some("raw") {
        return None;
    }
    cgroup.map(|_| JOB_UID)
}

pub const PROBE_ENV: &str = "TNW_PROBE";
pub const PROBE_TEST: &str = "zz_probe_helper";
/// Unprivileged uid/gid the job probes run as (both tenants: same uid).
pub const JOB_UID: u32 = 65534;

/// Command that runs this test binary in probe mode `args` (e.g. "tcp-listen 0.0.0.0:5001").
/// `cgroup`: the probe moves itself into that cgroup before exec (as a job task would).
/// `netns`: run through `nsenter --net=` instead of inheriting the thread's namespace.
pub fn probe_cmd(
    args: &str,
    cgroup: Option<&Path>,
    netns: Option<&Netns>,
    uid: Option<u32>,
) -> Command {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net={}", ns.path().display()))
                .arg("--")
                .arg(exe);
            c
        }
        None => Command::new(exe),
    };
    cmd.args([PROBE_TEST, "--exact", "--nocapture", "--test-threads", "1"])
        .env(PROBE_ENV, args)
        .stdin(Stdio::null());
    if let Some(u) = uid {
        cmd.uid(u).gid(u);
    }
    // SAFETY: prctl is async-signal-safe. The probe dies with the thread that spawned it.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    if let Some(cg) = cgroup {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(cg.join("cgroup.procs"))
            .unwrap();
        // SAFETY: only write(2) on an fd opened before fork; async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                let fd = f.as_raw_fd();
                if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd
}

/// Start a listening probe and wait until it printed READY.
pub fn start_listener(procs: &mut Procs, args: &str, cgroup: Option<&Path>, netns: Option<&Netns>) {
    let mut child = probe_cmd(args, cgroup, netns, cgroup.map(|_| JOB_UID))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    procs.0.push(child);
    let mut r = BufReader::new(out);
    let mut line = String::new();
    loop {
        line.clear();
        let n = r.read_line(&mut line).unwrap();
        assert!(n > 0, "listener {args} exited before READY");
        if line.trim_end().ends_with("READY") {
            break;
        }
    }
    // Keep draining its stdout so it never blocks.
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = r.read_to_end(&mut sink);
    });
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Outcome {
    Ok,
    /// TCP: the handshake never completed (SYN dropped); UDP: no answer.
    Timeout,
    /// TCP connected but the echo never came back.
    NoReply,
    Refused,
    /// A datagram's send failed with EPERM: the output hook dropped it.
    Denied,
    Other(i32),
}

fn outcome(st: std::process::ExitStatus) -> Outcome {
    match st.code() {
        Some(0) => Outcome::Ok,
        Some(11) => Outcome::Timeout,
        Some(12) => Outcome::Refused,
        Some(15) => Outcome::NoReply,
        Some(16) => Outcome::Denied,
        c => Outcome::Other(c.unwrap_or(-1)),
    }
}

/// Run a client probe ("tcp ADDR" / "udp ADDR") and report how it went.
pub fn client(args: &str, cgroup: Option<&Path>) -> Outcome {
    client_in(args, cgroup, None)
}

/// [`client`] run in `netns` (through nsenter) instead of the calling thread's namespace.
pub fn client_in(args: &str, cgroup: Option<&Path>, netns: Option<&Netns>) -> Outcome {
    let st = probe_cmd(args, cgroup, netns, probe_uid(args, cgroup))
        .stdout(Stdio::null())
        .status()
        .unwrap();
    outcome(st)
}

/// Start a `dgram-recv` probe and return it once its socket is bound (READY); [`received`]
/// then tells whether a datagram reached it.
pub fn start_receiver(args: &str, cgroup: Option<&Path>, netns: Option<&Netns>) -> Child {
    let mut child = probe_cmd(args, cgroup, netns, probe_uid(args, cgroup))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut r = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        let n = r.read_line(&mut line).unwrap();
        assert!(n > 0, "receiver {args} exited before READY");
        if line.trim_end().ends_with("READY") {
            break;
        }
    }
    child
}

/// Ok: the receiver got a datagram within [`RECV_WINDOW`]; Timeout: it got none.
pub fn received(mut child: Child) -> Outcome {
    outcome(child.wait().unwrap())
}

/// How long a `dgram-recv` probe waits for a datagram once bound.
pub const RECV_WINDOW: Duration = Duration::from_millis(2500);

pub const CLIENT_TIMEOUT: Duration = Duration::from_millis(800);
pub const LISTENER_LIFETIME: Duration = Duration::from_secs(120);

/// Body of the probe process. Exit codes: 0 ok, 11 timeout, 12 refused, 13 other error.
pub fn probe_main(spec: &str) -> ! {
    let mut it = spec.split_whitespace();
    let mode = it.next().unwrap_or("");
    // Watchdog: no probe outlives a stuck test.
    std::thread::spawn(|| {
        std::thread::sleep(LISTENER_LIFETIME);
        std::process::exit(14);
    });
    if mode.starts_with("dgram-") {
        let proto = it.next().unwrap_or("");
        let addr: SocketAddr = it.next().unwrap_or("").parse().expect("probe address");
        std::process::exit(dgram_probe(mode, proto, addr, it.collect()));
    }
    let addr: SocketAddr = it.next().unwrap_or("").parse().expect("probe address");
    let code = match mode {
        "tcp-listen" => {
            let l = TcpListener::bind(addr).expect("bind");
            println!("READY");
            let _ = std::io::stdout().flush();
            for s in l.incoming().flatten() {
                let mut s = s;
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let mut buf = [0u8; 64];
                if let Ok(n) = s.read(&mut buf) {
                    let _ = s.write_all(&buf[..n]);
                }
            }
            0
        }
        "udp-listen" => {
            let u = UdpSocket::bind(addr).expect("bind");
            println!("READY");
            let _ = std::io::stdout().flush();
            let mut buf = [0u8; 64];
            let deadline = std::time::Instant::now() + LISTENER_LIFETIME;
            while std::time::Instant::now() < deadline {
                if let Ok((n, from)) = u.recv_from(&mut buf) {
                    let _ = u.send_to(&buf[..n], from);
                }
            }
            0
        }
        "tcp" => match TcpStream::connect_timeout(&addr, CLIENT_TIMEOUT) {
            Ok(mut s) => {
                let _ = s.set_read_timeout(Some(CLIENT_TIMEOUT));
                let _ = s.write_all(b"ping");
                let mut buf = [0u8; 4];
                match s.read_exact(&mut buf) {
                    Ok(()) if &buf == b"ping" => 0,
                    // connected, but no answer: a different outcome from a refused handshake
                    Err(e)
                        if e.kind() == std::io::ErrorKind::WouldBlock
                            || e.kind() == std::io::ErrorKind::TimedOut =>
                    {
                        15
                    }
                    _ => 13,
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => 11,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => 12,
            Err(e) => {
                eprintln!("connect {addr}: {e}");
                13
            }
        },
        "udp" => {
            let bind: SocketAddr = if addr.is_ipv4() {
                "0.0.0.0:0".parse().unwrap()
            } else {
                "[::]:0".parse().unwrap()
            };
            let u = UdpSocket::bind(bind).expect("bind");
            u.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
            match u.send_to(b"ping", addr) {
                Err(e) => {
                    eprintln!("send {addr}: {e}");
                    13
                }
                Ok(_) => {
                    let mut buf = [0u8; 8];
                    match u.recv_from(&mut buf) {
                        Ok((4, _)) if &buf[..4] == b"ping" => 0,
                        Err(e)
                            if e.kind() == std::io::ErrorKind::WouldBlock
                                || e.kind() == std::io::ErrorKind::TimedOut =>
                        {
                            11
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => 12,
                        _ => 13,
                    }
                }
            }
        }
        m => panic!("unknown probe mode {m:?}"),
    };
    std::process::exit(code)
}

/// Datagram probes over UDP, UDP-Lite or raw IP (`PROTO` = udp | udplite | raw; raw binds and
/// sends with port 0):
///
/// * `dgram-recv PROTO ADDR [reuse] [seed=ADDR] [join=GROUP@IFADDR]`: binds ADDR (SO_REUSEADDR
///   with `reuse`), joins an IPv4 multicast group, sends five datagrams to the `seed` address
///   from the bound socket, prints READY and waits [`RECV_WINDOW`] for a datagram: 0 when one
///   came, 11 when none did.
/// * `dgram-send PROTO ADDR [bind=ADDR]`: sends three datagrams (SO_BROADCAST set; from ADDR,
///   with SO_REUSEADDR, with `bind`): 0 when all were sent, 16 when the output hook refused
///   one (EPERM), 13 on another error.
fn dgram_probe(mode: &str, proto: &str, addr: SocketAddr, opts: Vec<&str>) -> i32 {
    use rustix::net::{ipproto, sockopt, AddressFamily, SocketFlags, SocketType};
    let udp = |a: &SocketAddr| -> UdpSocket {
        let family = if a.is_ipv4() {
            AddressFamily::INET
        } else {
            AddressFamily::INET6
        };
        let (kind, p) = match proto {
            "udp" => (SocketType::DGRAM, ipproto::UDP),
            "udplite" => (SocketType::DGRAM, ipproto::UDPLITE),
            // Raw IP of an experimental protocol number (RFC 3692): needs CAP_NET_RAW.
            "raw" => (SocketType::RAW, rustix::net::Protocol::from_raw(RAW_PROTO)),
            p => panic!("unknown datagram protocol {p:?}"),
        };
        let fd =
            rustix::net::socket_with(family, kind, SocketFlags::CLOEXEC, Some(p)).expect("socket");
        UdpSocket::from(fd)
    };
    let opt = |name: &str| {
        opts.iter()
            .find_map(|o| o.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
    };
    match mode {
        "dgram-recv" => {
            let u = udp(&addr);
            if opts.contains(&"reuse") {
                sockopt::set_socket_reuseaddr(&u, true).unwrap();
            }
            rustix::net::bind(&u, &addr).expect("bind");
            if let Some(j) = opt("join") {
                let (group, ifaddr) = j.split_once('@').expect("join=GROUP@IFADDR");
                u.join_multicast_v4(&group.parse().unwrap(), &ifaddr.parse().unwrap())
                    .expect("join");
            }
            if let Some(seed) = opt("seed") {
                let seed: SocketAddr = seed.parse().expect("seed address");
                for _ in 0..5 {
                    let _ = u.send_to(b"seed", seed);
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            println!("READY");
            let _ = std::io::stdout().flush();
            let deadline = std::time::Instant::now() + RECV_WINDOW;
            let mut buf = [0u8; 64];
            loop {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return 11;
                }
                u.set_read_timeout(Some(left)).unwrap();
                match u.recv_from(&mut buf) {
                    // (stdout is closed by now: the test stopped reading at READY)
                    Ok(_) => return 0,
                    // ICMP errors that the seeds drew (port unreachable) are not datagrams
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => continue,
                    Err(_) => return 11,
                }
            }
        }
        "dgram-send" => {
            let u = match opt("bind") {
                Some(b) => {
                    let b: SocketAddr = b.parse().expect("bind address");
                    let u = udp(&b);
                    sockopt::set_socket_reuseaddr(&u, true).unwrap();
                    rustix::net::bind(&u, &b).expect("bind");
                    u
                }
                None => udp(&addr),
            };
            sockopt::set_socket_broadcast(&u, true).unwrap();
            let mut code = 0;
            for _ in 0..3 {
                match u.send_to(b"ping", addr) {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EPERM) => code = 16,
                    Err(e) => {
                        eprintln!("send {addr}: {e}");
                        return 13;
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            code
        }
        m => panic!("unknown probe mode {m:?}"),
    }
}

/// Run `body` on a fresh thread that has entered `ns` (the test thread itself stays put).
pub fn in_netns<T: Send + 'static>(ns: &Netns, body: impl FnOnce() -> T + Send + 'static) -> T {
    let path = ns.path();
    let h = std::thread::spawn(move || {
        let f = std::fs::File::open(&path).unwrap();
        // SAFETY: valid fd; only this thread changes namespace.
        let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        body()
    });
    match h.join() {
        Ok(v) => v,
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// `nft` with args in the calling thread's namespace; stdout.
pub fn nft(args: &[&str]) -> String {
    let out = Command::new("nft").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "nft {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The table `tenancy` over `tree` for tenants a (id 1) and b (id 2) with these egress lists;
/// no infrastructure, Slurm or cross-node rules.
pub fn two_tenants(tree: &CgroupTree, a: Vec<Dest>, b: Vec<Dest>) -> FirewallSpec {
    let tenant = |name: &str, id, egress| TenantNet {
        name: name.into(),
        id,
        egress,
    };
    FirewallSpec {
        table_name: "tenancy".into(),
        cgroup: tree.layout.clone(),
        tenants: vec![tenant("a", 1, a), tenant("b", 2, b)],
        infrastructure: vec![],
        slurm: None,
        cross_node: None,
    }
}

/// The packets dropped so far for `tenant` (its counter).
pub fn drops(spec: &FirewallSpec, tenant: &str) -> u64 {
    counters(spec)
        .unwrap()
        .into_iter()
        .find(|c| c.tenant == tenant)
        .unwrap()
        .packets
}

/// Runs each case's client (name, job cgroup or None, probe arguments, the outcome wanted):
/// one line for each that got another outcome.
pub fn client_failures(cases: &[(&str, Option<&Path>, &str, Outcome)]) -> Vec<String> {
    let mut failures = Vec::new();
    for (name, cg, args, want) in cases {
        let got = client(args, *cg);
        if got != *want {
            failures.push(format!("{name}: {args}: got {got:?}, want {want:?}"));
        }
    }
    failures
}
