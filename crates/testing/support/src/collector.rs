//! A real syslog collector for the forwarder's tests (tenancyctl's, and the soak's on the
//! multi-node cluster): Debian's rsyslog with its GnuTLS driver (rsyslog-gnutls), started on a
//! free port of 127.0.0.1 (or of an address in a network namespace) with a CA and
//! certificates made here with the openssl CLI, stopped by pid. It files records and anchors apart, per node, as
//! docs/audit.md tells a site to: `out/<node>/audit.jsonl` and `out/<node>/anchors.log`, each
//! line the message as the node sent it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Where rsyslogd is, or why the test cannot run (a SKIP outside CI, a failure in CI).
pub fn rsyslogd() -> Option<PathBuf> {
    let p = PathBuf::from("/usr/sbin/rsyslogd");
    let gtls = Path::new("/usr/lib/x86_64-linux-gnu/rsyslog/lmnsd_gtls.so");
    let have_gtls = gtls.exists()
        || std::fs::read_dir("/usr/lib")
            .ok()
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| e.path().join("rsyslog/lmnsd_gtls.so").exists());
    if p.is_file() && have_gtls {
        return Some(p);
    }
    crate::skip(
        "needs rsyslog and rsyslog-gnutls",
        "scripts/install-deps installs them (apt-get install rsyslog rsyslog-gnutls)",
    );
    None
}

fn openssl(dir: &Path, args: &[&str]) {
    let o = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl");
    assert!(
        o.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `openssl req` with a new P-256 key `key` (unencrypted) and its request (or with `-x509` its
/// certificate) `out`; `extra`: the other options.
fn new_ec_req(dir: &Path, key: &str, out: &str, extra: &[&str]) {
    let mut args = vec![
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
    ];
    args.extend(["-nodes", "-keyout", key, "-out", out]);
    args.extend_from_slice(extra);
    openssl(dir, &args);
}

/// A CA (`<name>-ca.pem`, `<name>-ca.key`) in `dir`.
pub fn make_ca(dir: &Path, name: &str) -> PathBuf {
    new_ec_req(
        dir,
        &format!("{name}-ca.key"),
        &format!("{name}-ca.pem"),
        &[
            "-x509",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name} test CA"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
    dir.join(format!("{name}-ca.pem"))
}

/// A certificate `<name>.pem` with key `<name>.key` signed by the CA `ca`, for 127.0.0.1.
pub fn make_cert(dir: &Path, ca: &str, name: &str, usage: &str) -> (PathBuf, PathBuf) {
    make_cert_for(dir, ca, name, usage, "IP:127.0.0.1,DNS:localhost")
}

/// [`make_cert`] for the subject alternative names `san` (`IP:10.0.0.1,DNS:collector`).
pub fn make_cert_for(
    dir: &Path,
    ca: &str,
    name: &str,
    usage: &str,
    san: &str,
) -> (PathBuf, PathBuf) {
    let subject = format!("/CN={name}");
    new_ec_req(
        dir,
        &format!("{name}.key"),
        &format!("{name}.csr"),
        &["-subj", &subject],
    );
    let ext = dir.join(format!("{name}.ext"));
    std::fs::write(
        &ext,
        format!(
            "subjectAltName={san}\nbasicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage={usage}\n"
        ),
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}-ca.pem"),
            "-CAkey",
            &format!("{ca}-ca.key"),
            "-CAcreateserial",
            "-out",
            &format!("{name}.pem"),
            "-days",
            "2",
            "-extfile",
            ext.to_str().unwrap(),
        ],
    );
    let key = dir.join(format!("{name}.key"));
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    (dir.join(format!("{name}.pem")), key)
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One rsyslogd of the test's.
pub struct Rsyslog {
    pub dir: PathBuf,
    pub port: u16,
    pub out: PathBuf,
    conf: PathBuf,
    pid: Option<i32>,
    address: String,
    /// The network namespace (a name under /run/netns) it listens in; None: this one.
    netns: Option<String>,
}

impl Rsyslog {
    /// Writes its config in `dir` (a server certificate of CA `ca`; `client_auth`: the
    /// collector asks for a client certificate of that CA) and starts it on 127.0.0.1.
    pub fn start(dir: &Path, ca: &str, server: &str, client_auth: bool) -> Rsyslog {
        Rsyslog::start_at(dir, ca, server, client_auth, "127.0.0.1", None)
    }

    /// [`Rsyslog::start`] on `address`, in the network namespace `netns` (`ip netns` name).
    pub fn start_at(
        dir: &Path,
        ca: &str,
        server: &str,
        client_auth: bool,
        address: &str,
        netns: Option<&str>,
    ) -> Rsyslog {
        let port = free_port();
        let out = dir.join("out");
        let work = dir.join("work");
        std::fs::create_dir_all(&work).unwrap();
        std::fs::create_dir_all(&out).unwrap();
        let conf = dir.join("rsyslog.conf");
        std::fs::write(
            &conf,
            format!(
                r#"global(workDirectory="{work}" maxMessageSize="64k"
  defaultNetstreamDriver="gtls"
  defaultNetstreamDriverCAFile="{d}/{ca}-ca.pem"
  defaultNetstreamDriverCertFile="{d}/{server}.pem"
  defaultNetstreamDriverKeyFile="{d}/{server}.key")
module(load="imtcp" streamDriver.name="gtls" streamDriver.mode="1"
  streamDriver.authMode="{auth}")
input(type="imtcp" address="{address}" port="{port}")
template(name="tenancyRecords" type="string" string="{out}/%hostname%/audit.jsonl")
template(name="tenancyAnchors" type="string" string="{out}/%hostname%/anchors.log")
template(name="tenancyLine" type="string" string="%msg%\n")
if $app-name == "tenancy-audit" and $msgid == "record" then {{
  action(type="omfile" dynaFile="tenancyRecords" template="tenancyLine"
    action.resumeRetryCount="-1")
  stop
}}
if $app-name == "tenancy-audit" and $msgid == "anchor" then {{
  action(type="omfile" dynaFile="tenancyAnchors" template="tenancyLine"
    action.resumeRetryCount="-1")
  stop
}}
"#,
                work = work.display(),
                d = dir.display(),
                out = out.display(),
                auth = if client_auth {
                    "x509/certvalid"
                } else {
                    "anon"
                },
            ),
        )
        .unwrap();
        let mut r = Rsyslog {
            dir: dir.to_path_buf(),
            port,
            out,
            conf,
            pid: None,
            address: address.to_string(),
            netns: netns.map(str::to_string),
        };
        r.resume();
        r
    }

    /// Starts rsyslogd again on the same port (after [`Rsyslog::stop`]).
    pub fn resume(&mut self) {
        let pidfile = self.dir.join("rsyslogd.pid");
        let _ = std::fs::remove_file(&pidfile);
        // `ip netns exec` enters the namespace and execs rsyslogd (the pid is rsyslogd's).
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "/usr/sbin/rsyslogd"]);
                c
            }
            None => Command::new("/usr/sbin/rsyslogd"),
        };
        let child = cmd
            .arg("-n")
            .arg("-f")
            .arg(&self.conf)
            .arg("-i")
            .arg(&pidfile)
            .stdout(std::fs::File::create(self.dir.join("rsyslogd.out")).unwrap())
            .stderr(std::fs::File::create(self.dir.join("rsyslogd.err")).unwrap())
            .spawn()
            .expect("rsyslogd");
        let pid = child.id() as i32;
        // Reaped by whoever waits; the test stops it by pid.
        std::mem::forget(child);
        self.pid = Some(pid);
        let t = Instant::now();
        while !self.listening() {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "rsyslogd did not listen on {}: {}",
                self.port,
                std::fs::read_to_string(self.dir.join("rsyslogd.err")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether rsyslogd takes connections on its address and port.
    fn listening(&self) -> bool {
        match &self.netns {
            None => std::net::TcpStream::connect((self.address.as_str(), self.port)).is_ok(),
            Some(ns) => Command::new("ip")
                .args(["netns", "exec", ns, "ss", "-Hltn"])
                .arg(format!("sport = :{}", self.port))
                .output()
                .is_ok_and(|o| !o.stdout.iter().all(u8::is_ascii_whitespace)),
        }
    }

    /// Stops rsyslogd (SIGTERM, by pid) and waits for it to exit.
    pub fn stop(&mut self) {
        self.signal(libc::SIGTERM);
    }

    /// Kills rsyslogd (SIGKILL, by pid): what it had received and not yet written is lost, as
    /// when a collector crashes or its host goes down.
    pub fn crash(&mut self) {
        self.signal(libc::SIGKILL);
    }

    /// Stops rsyslogd in its tracks (SIGSTOP): a hung collector, whose kernel still
    /// acknowledges what it is sent until its socket buffer is full.
    pub fn hang(&self) {
        if let Some(pid) = self.pid {
            unsafe { libc::kill(pid, libc::SIGSTOP) };
        }
    }

    fn signal(&mut self, sig: i32) {
        let Some(pid) = self.pid.take() else { return };
        unsafe { libc::kill(pid, sig) };
        let mut status = 0;
        unsafe { libc::waitpid(pid, &mut status, 0) };
    }

    pub fn collector(&self) -> String {
        format!("{}:{}", self.address, self.port)
    }

    pub fn records(&self, node: &str) -> PathBuf {
        self.out.join(node).join("audit.jsonl")
    }

    pub fn anchors(&self, node: &str) -> PathBuf {
        self.out.join(node).join("anchors.log")
    }

    /// Lines of the collector's record file of `node`.
    pub fn record_lines(&self, node: &str) -> Vec<String> {
        std::fs::read_to_string(self.records(node))
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    }
}

impl Drop for Rsyslog {
    fn drop(&mut self) {
        self.stop();
    }
}
