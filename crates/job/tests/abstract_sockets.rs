//! Landlock's abstract-socket scoping as slurmstepd applies it (src/abstract_sockets.rs): a
//! process of a scoped domain (a step) reaches the abstract sockets its own domain made, and no
//! other: not those of a process outside every domain (the node's), not those of a sibling
//! domain (another step or job). A process outside every domain still reaches the domain's
//! socket. Needs root (Landlock without no_new_privs takes CAP_SYS_ADMIN) and a kernel with
//! Landlock ABI 6 (Linux 6.12); skips loudly otherwise.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use tenancy_job::abstract_sockets::{kernel_scopes, scope_self, Scoping};
use tenancy_test_support::requires_root;

const ROLE: &str = "TN_ABSTRACT_ROLE";

fn name(tag: &str) -> String {
    format!("tenancy-test-{}-{tag}", std::process::id())
}

fn listen(n: &str) -> UnixListener {
    UnixListener::bind_addr(&SocketAddr::from_abstract_name(n.as_bytes()).unwrap()).unwrap()
}

/// "ok" or the errno's name of a connect to the abstract socket `n`.
fn connect(n: &str) -> String {
    let addr = SocketAddr::from_abstract_name(n.as_bytes()).unwrap();
    match UnixStream::connect_addr(&addr) {
        Ok(mut s) => {
            let mut b = [0u8; 2];
            let _ = s.read_exact(&mut b);
            "ok".into()
        }
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => "EPERM".into(),
        Err(e) => format!("{e}"),
    }
}

fn serve(l: UnixListener) {
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let mut s = s;
            let _ = s.write_all(b"hi");
        }
    });
}

/// The child roles, this test binary re-executed: a scoped "step" that listens on its own
/// socket, then reports connects to the names it is given; a second scoped step.
#[test]
fn zz_role() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let args: Vec<String> = role.split(' ').map(String::from).collect();
    assert_eq!(scope_self().unwrap(), Scoping::Applied);
    if let Some(own) = args.first().filter(|a| !a.is_empty() && *a != "-") {
        serve(listen(own));
        // A process the step forks after the domain was made is in it too.
        let child = Command::new(std::env::current_exe().unwrap())
            .args(["zz_connect", "--exact", "--nocapture"])
            .env("TN_ABSTRACT_CONNECT", own)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&child.stdout);
        let got = out
            .lines()
            .find_map(|l| l.strip_prefix("connect="))
            .unwrap_or("none");
        println!("forked->own={got}");
    }
    for target in &args[1..] {
        println!("{target}={}", connect(target));
    }
    println!("READY");
    let _ = std::io::stdout().flush();
    std::thread::sleep(Duration::from_secs(5));
}

#[test]
fn zz_connect() {
    if let Ok(n) = std::env::var("TN_ABSTRACT_CONNECT") {
        println!("connect={}", connect(&n));
    }
}

fn role(args: &str) -> (std::process::Child, Vec<(String, String)>) {
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args(["zz_role", "--exact", "--nocapture", "--test-threads", "1"])
        .env(ROLE, args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut r = BufReader::new(c.stdout.take().unwrap());
    let mut seen = Vec::new();
    let mut line = String::new();
    while r.read_line(&mut line).unwrap() > 0 {
        let l = line.trim_end().to_string();
        line.clear();
        if l == "READY" {
            break;
        }
        // (libtest prints "test zz_role ... " before the first line)
        if let Some((k, v)) = l.split_once('=') {
            let k = k.rsplit(' ').next().unwrap_or(k);
            seen.push((k.to_string(), v.to_string()));
        }
    }
    (c, seen)
}

#[test]
fn a_scoped_step_reaches_only_its_own_abstract_sockets() {
    if !requires_root("Landlock without no_new_privs") {
        return;
    }
    if !kernel_scopes() {
        eprintln!(
            "SKIP: this kernel's Landlock (ABI {:?}) cannot scope abstract UNIX sockets",
            tenancy_job::abstract_sockets::kernel_abi()
        );
        return;
    }
    // The node's own socket (no domain), a step's, and another step's view of both.
    let node = name("node");
    serve(listen(&node));
    let a = name("a");
    let (mut step_a, seen_a) = role(&format!("{a} {node}"));
    let get = |seen: &[(String, String)], k: &str| {
        seen.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| format!("nothing for {k} in {seen:?}"))
    };
    assert_eq!(get(&seen_a, "forked->own"), "ok", "the step's own socket");
    assert_eq!(
        get(&seen_a, &node),
        "EPERM",
        "the node's socket from a step"
    );
    let (mut step_b, seen_b) = role(&format!("- {a}"));
    assert_eq!(get(&seen_b, &a), "EPERM", "another step's socket");
    // Outside every domain (slurmd, an admin's shell): reaches the step's socket.
    assert_eq!(connect(&a), "ok", "the step's socket from outside");
    for c in [&mut step_a, &mut step_b] {
        let _ = c.kill();
        let _ = c.wait();
    }
}
