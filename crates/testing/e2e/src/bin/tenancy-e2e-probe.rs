//! What a job's tasks run in the e2e tests and the demo: reports what the task sees and
//! attempts the isolation attacks, printing one `key=value` line per fact so the tests can
//! check them without a shell in between.
//!
//! ```text
//! tenancy-e2e-probe env                      # tenant, GPU, scratch, owner of TMPDIR, cgroups
//! tenancy-e2e-probe write PATH TEXT          # write=ok | write=ERRNO
//! tenancy-e2e-probe read PATH                # read=ok TEXT | read=ERRNO
//! tenancy-e2e-probe open PATH                # open=ok | open=ERRNO (device nodes)
//! tenancy-e2e-probe connect HOST:PORT MS     # connect=ok REPLY | refused | timeout | ERRNO
//! tenancy-e2e-probe serve PORT UNTIL_FILE    # listen on 0.0.0.0:PORT until the file exists
//! tenancy-e2e-probe wait UNTIL_FILE [SECS]   # hold the job until the file exists
//! tenancy-e2e-probe envwait UNTIL_FILE       # env, then wait
//! tenancy-e2e-probe shm KEY [create]         # SysV shared memory segment KEY (made 0666 with
//!                                            # create): shm=ok ID | shm=ERRNO
//! tenancy-e2e-probe collect PORT UNTIL_FILE  # listen on 0.0.0.0:PORT, take every connection
//!                                            # and what it sends: from=PEER BYTES per one,
//!                                            # accepted=N at the end
//! tenancy-e2e-probe userve NAME UNTIL_FILE   # listen on the abstract UNIX socket NAME
//! tenancy-e2e-probe uconnect NAME            # uconnect=ok REPLY | uconnect=ERRNO
//! ```
//!
//! Exit status is 0 whenever the attempt was made (the outcome is in the output), 2 on misuse.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn errno_name(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EACCES) => "EACCES".into(),
        Some(libc::EPERM) => "EPERM".into(),
        Some(libc::ENOENT) => "ENOENT".into(),
        Some(libc::ENXIO) => "ENXIO".into(),
        Some(libc::ENODEV) => "ENODEV".into(),
        Some(libc::ECONNREFUSED) => "refused".into(),
        Some(libc::ETIMEDOUT) => "timeout".into(),
        Some(libc::EHOSTUNREACH) => "EHOSTUNREACH".into(),
        Some(libc::ENETUNREACH) => "ENETUNREACH".into(),
        Some(n) => format!("errno{n}"),
        None if e.kind() == std::io::ErrorKind::TimedOut => "timeout".into(),
        None => format!("{:?}", e.kind()),
    }
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn env_report() {
    println!("started_at={:.3}", now());
    // SAFETY: plain libc getters.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    println!("uid={uid}");
    println!("gid={gid}");
    for k in [
        "SLURM_JOB_ID",
        "SLURM_STEP_ID",
        "TENANCY_TENANT",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "TMPDIR",
        "TENANCY_SCRATCH",
    ] {
        println!("{k}={}", std::env::var(k).unwrap_or_default());
    }
    if let Ok(tmp) = std::env::var("TMPDIR") {
        match std::fs::symlink_metadata(&tmp) {
            Ok(m) => {
                println!("tmpdir_owner={}", m.uid());
                println!("tmpdir_group={}", m.gid());
                println!("tmpdir_mode={:o}", m.mode() & 0o7777);
            }
            Err(e) => println!("tmpdir_owner={}", errno_name(&e)),
        }
        let probe = Path::new(&tmp).join(format!(".probe-{}", std::process::id()));
        match std::fs::write(&probe, b"x").and_then(|_| std::fs::remove_file(&probe)) {
            Ok(()) => println!("tmpdir_writable=yes"),
            Err(e) => println!("tmpdir_writable={}", errno_name(&e)),
        }
    }
    for line in std::fs::read_to_string("/proc/self/cgroup")
        .unwrap_or_default()
        .lines()
    {
        println!("cgroup={line}");
    }
}

fn serve(port: u16, until: &Path) -> Result<(), String> {
    let l = TcpListener::bind(("0.0.0.0", port)).map_err(|e| format!("bind {port}: {e}"))?;
    l.set_nonblocking(true).map_err(|e| e.to_string())?;
    println!("listening={port}");
    let _ = std::io::stdout().flush();
    let mut served = 0u32;
    while !until.exists() {
        match l.accept() {
            Ok((mut s, _)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.write_all(b"hello from the listener\n");
                let _ = s.shutdown(Shutdown::Both);
                served += 1;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => return Err(format!("accept: {e}")),
        }
    }
    println!("served={served}");
    Ok(())
}

/// Takes every connection to 0.0.0.0:`port` until `until` exists and reports each one with the
/// bytes it sent (a Slurm message, a step's output): what an attacker steers at this port.
fn collect(port: u16, until: &Path) -> Result<(), String> {
    let l = TcpListener::bind(("0.0.0.0", port)).map_err(|e| format!("bind {port}: {e}"))?;
    l.set_nonblocking(true).map_err(|e| e.to_string())?;
    println!("listening={port}");
    let _ = std::io::stdout().flush();
    let mut accepted = 0u32;
    while !until.exists() {
        match l.accept() {
            Ok((mut s, peer)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(Duration::from_millis(1500)));
                let mut got = Vec::new();
                let _ = s.read_to_end(&mut got);
                accepted += 1;
                println!("from={peer} {}", got.len());
                let _ = std::io::stdout().flush();
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => return Err(format!("accept: {e}")),
        }
    }
    println!("accepted={accepted}");
    Ok(())
}

/// Serves "hello" on the abstract UNIX socket `name` until `until` exists.
fn userve(name: &str, until: &Path) -> Result<(), String> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener};
    let addr = UnixAddr::from_abstract_name(name.as_bytes()).map_err(|e| e.to_string())?;
    let l = UnixListener::bind_addr(&addr).map_err(|e| format!("bind @{name}: {e}"))?;
    l.set_nonblocking(true).map_err(|e| e.to_string())?;
    println!("ulistening={name}");
    let _ = std::io::stdout().flush();
    while !until.exists() {
        match l.accept() {
            Ok((mut s, _)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.write_all(b"hello from the abstract socket\n");
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => return Err(format!("accept: {e}")),
        }
    }
    Ok(())
}

fn uconnect(name: &str) -> Result<(), String> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr as UnixAddr, UnixStream};
    let addr = UnixAddr::from_abstract_name(name.as_bytes()).map_err(|e| e.to_string())?;
    match UnixStream::connect_addr(&addr) {
        Ok(mut s) => {
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let mut buf = String::new();
            let _ = s.read_to_string(&mut buf);
            println!("uconnect=ok {}", buf.trim());
        }
        Err(e) => println!("uconnect={}", errno_name(&e)),
    }
    Ok(())
}

fn connect(target: &str, ms: u64) -> Result<(), String> {
    let addr: SocketAddr = target
        .to_socket_addrs()
        .map_err(|e| format!("{target}: {e}"))?
        .next()
        .ok_or_else(|| format!("{target}: no address"))?;
    match TcpStream::connect_timeout(&addr, Duration::from_millis(ms)) {
        Ok(mut s) => {
            let _ = s.set_read_timeout(Some(Duration::from_millis(ms)));
            let mut buf = String::new();
            let _ = s.read_to_string(&mut buf);
            println!("connect=ok {}", buf.trim());
        }
        Err(e) => println!("connect={}", errno_name(&e)),
    }
    Ok(())
}

fn wait(until: &Path, secs: u64) -> Result<(), String> {
    let t = Instant::now();
    while !until.exists() {
        if t.elapsed() > Duration::from_secs(secs) {
            return Err(format!(
                "{} did not appear within {secs} s",
                until.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("released_at={:.3}", now());
    Ok(())
}

fn run(args: &[String]) -> Result<(), String> {
    let a = |i: usize| {
        args.get(i)
            .map(String::as_str)
            .ok_or_else(|| "missing argument (see the usage in the source)".to_string())
    };
    match a(0)? {
        "env" => env_report(),
        "write" => match std::fs::write(a(1)?, a(2)?) {
            Ok(()) => println!("write=ok"),
            Err(e) => println!("write={}", errno_name(&e)),
        },
        "read" => match std::fs::read_to_string(a(1)?) {
            Ok(s) => println!("read=ok {}", s.trim()),
            Err(e) => println!("read={}", errno_name(&e)),
        },
        "open" => match std::fs::OpenOptions::new().read(true).open(a(1)?) {
            Ok(_) => println!("open=ok"),
            Err(e) => println!("open={}", errno_name(&e)),
        },
        "connect" => connect(
            a(1)?,
            a(2)?
                .parse()
                .map_err(|_| "MS must be a number".to_string())?,
        )?,
        "serve" => serve(
            a(1)?
                .parse()
                .map_err(|_| "PORT must be a number".to_string())?,
            Path::new(a(2)?),
        )?,
        "collect" => collect(
            a(1)?
                .parse()
                .map_err(|_| "PORT must be a number".to_string())?,
            Path::new(a(2)?),
        )?,
        "userve" => userve(a(1)?, Path::new(a(2)?))?,
        "uconnect" => uconnect(a(1)?)?,
        "wait" => wait(
            Path::new(a(1)?),
            args.get(2).and_then(|s| s.parse().ok()).unwrap_or(120),
        )?,
        "shm" => {
            let key: libc::key_t = a(1)?
                .parse()
                .map_err(|_| "KEY must be a number".to_string())?;
            let flags = if args.get(2).map(String::as_str) == Some("create") {
                libc::IPC_CREAT | 0o666
            } else {
                0
            };
            // SAFETY: plain syscall; no memory is attached.
            match unsafe { libc::shmget(key, 4096, flags) } {
                -1 => println!("shm={}", errno_name(&std::io::Error::last_os_error())),
                id => println!("shm=ok {id}"),
            }
        }
        "envwait" => {
            env_report();
            let _ = std::io::stdout().flush();
            wait(Path::new(a(1)?), 120)?
        }
        other => return Err(format!("unknown command {other:?}")),
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tenancy-e2e-probe: {e}");
            ExitCode::from(2)
        }
    }
}
