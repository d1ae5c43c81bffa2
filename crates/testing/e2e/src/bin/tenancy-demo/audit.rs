//! The demo's audit trail at the end: the month's statement and its cross-check with sacct,
//! and the node's records at a local syslog collector, verified there.

use super::{free_port, say, show, text};
use anyhow::{bail, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tenancy_e2e::Stack;

/// The month's priced statement as HTML files that outlive the demo, and the cross-check of the
/// audit log with Slurm's accounting (sacct). Returns 1 when the books disagree.
pub(crate) fn statement_and_cross_check(s: &Stack, jobs: &[u64]) -> Result<u32> {
    let month = chrono_month()?;
    let audit = s.paths.audit_log.display().to_string();
    let anchors = s.paths.audit_anchors.display().to_string();
    let out_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"))
        .join("demo-statement");
    let out_dir = std::path::absolute(&out_dir)?;
    say(&format!(
        "tenancyctl report --statement {month} --format html --out {} --anchor {anchors} {audit}",
        out_dir.display()
    ));
    let mut c = s.tenancyctl();
    c.args(["report", "--statement", &month, "--format", "html", "--out"])
        .arg(&out_dir)
        .args(["--anchor", &anchors, &audit]);
    let o = s.cluster.run(c)?;
    show(&o);
    if o.status.success() {
        println!(
            "    (the priced statements above, one HTML file per tenant: open them in a browser)"
        );
    }
    // slurmctld hands finished jobs to slurmdbd on its own time: wait until sacct has them.
    let t0 = Instant::now();
    loop {
        let mut c = s.cluster.cmd("sacct");
        c.args(["-a", "-X", "-n", "--parsable2", "-o", "JobIDRaw,State"]);
        let o = s.cluster.run(c)?;
        let txt = text(&o.stdout);
        let ended = jobs.iter().all(|j| {
            txt.lines()
                .any(|l| l.starts_with(&format!("{j}|")) && !l.ends_with("RUNNING"))
        });
        if ended || t0.elapsed() > Duration::from_secs(30) {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    say(&format!(
        "tenancyctl report --compare-sacct --statement {month} {audit}   (the audit log against Slurm's accounting)"
    ));
    let mut c = s.tenancyctl();
    c.args(["report", "--compare-sacct", "--statement", &month, &audit]);
    let o = s.cluster.run(c)?;
    show(&o);
    println!("    (exit {})", o.status.code().unwrap_or(-1));
    Ok(u32::from(!o.status.success()))
}

/// A local syslog collector: rsyslog with GnuTLS on a free port of 127.0.0.1, its CA and
/// certificate made with openssl, records and anchors filed per node (docs/audit.md).
pub(crate) struct Collector {
    pub(crate) dir: PathBuf,
    pub(crate) port: u16,
    pid: i32,
}

impl Collector {
    pub(crate) fn start(dir: &Path) -> Result<Collector> {
        fs::create_dir_all(dir.join("work"))?;
        let sh = |script: &str| -> Result<()> {
            let o = std::process::Command::new("sh")
                .arg("-ec")
                .arg(script)
                .current_dir(dir)
                .output()?;
            if !o.status.success() {
                bail!("{script}: {}", text(&o.stderr));
            }
            Ok(())
        };
        sh("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
            -keyout ca.key -out ca.pem -days 2 -subj '/CN=demo CA' \
            -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign 2>/dev/null
            openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout c.key \
            -out c.csr -subj /CN=collector 2>/dev/null
            printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > ext
            openssl x509 -req -in c.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out c.pem \
            -days 2 -extfile ext 2>/dev/null")?;
        let port = free_port()?;
        let d = dir.display();
        fs::write(
            dir.join("rsyslog.conf"),
            format!(
                r#"global(workDirectory="{d}/work" maxMessageSize="64k" defaultNetstreamDriver="gtls"
  defaultNetstreamDriverCAFile="{d}/ca.pem" defaultNetstreamDriverCertFile="{d}/c.pem"
  defaultNetstreamDriverKeyFile="{d}/c.key")
module(load="imtcp" streamDriver.name="gtls" streamDriver.mode="1" streamDriver.authMode="anon")
input(type="imtcp" address="127.0.0.1" port="{port}")
template(name="rec" type="string" string="{d}/out/%hostname%/audit.jsonl")
template(name="anc" type="string" string="{d}/out/%hostname%/anchors.log")
template(name="line" type="string" string="%msg%\n")
if $app-name == "tenancy-audit" and $msgid == "record" then {{
  action(type="omfile" dynaFile="rec" template="line" action.resumeRetryCount="-1")
  stop
}}
if $app-name == "tenancy-audit" and $msgid == "anchor" then {{
  action(type="omfile" dynaFile="anc" template="line" action.resumeRetryCount="-1")
  stop
}}
"#
            ),
        )?;
        let child = std::process::Command::new("/usr/sbin/rsyslogd")
            .args(["-n", "-f"])
            .arg(dir.join("rsyslog.conf"))
            .arg("-i")
            .arg(dir.join("pid"))
            .stdout(fs::File::create(dir.join("rsyslogd.log"))?)
            .stderr(fs::File::create(dir.join("rsyslogd.err"))?)
            .spawn()
            .context("rsyslogd (apt-get install rsyslog rsyslog-gnutls)")?;
        let c = Collector {
            dir: dir.to_path_buf(),
            port,
            pid: child.id() as i32,
        };
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if t0.elapsed() > Duration::from_secs(20) {
                bail!(
                    "rsyslogd did not listen on {port}: {}",
                    fs::read_to_string(dir.join("rsyslogd.err"))?
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(c)
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid),
            nix::sys::signal::SIGTERM,
        );
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(self.pid), None);
    }
}

/// The forwarder stops (it sends its own stop first); the collector's copy, as rsyslog wrote
/// it, verifies against the node's signed anchors. Returns 1 when it does not.
pub(crate) fn verify_at_collector(
    s: &Stack,
    collector: &Collector,
    mut forwarder: std::process::Child,
    public_keys: &Path,
) -> Result<u32> {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(forwarder.id() as i32),
        nix::sys::signal::SIGTERM,
    );
    forwarder.wait()?;
    let node = &s.cluster.node;
    let records = collector.dir.join(format!("out/{node}/audit.jsonl"));
    let anchors = collector.dir.join(format!("out/{node}/anchors.log"));
    // rsyslog writes on its own time.
    let local = fs::read_to_string(&s.paths.audit_log)?.lines().count();
    let t0 = Instant::now();
    while fs::read_to_string(&records).map_or(0, |t| t.lines().count()) < local
        && t0.elapsed() < Duration::from_secs(20)
    {
        std::thread::sleep(Duration::from_millis(200));
    }
    say(&format!(
        "tenancyctl audit verify --public-keys {} --anchor {} {}   (the collector's copy, as rsyslog wrote it)",
        public_keys.display(),
        anchors.display(),
        records.display()
    ));
    let mut c = s.tenancyctl();
    c.args(["audit", "verify", "--public-keys"])
        .arg(public_keys)
        .arg("--anchor")
        .arg(&anchors)
        .arg(&records);
    let o = s.cluster.run(c)?;
    show(&o);
    println!("    (exit {})", o.status.code().unwrap_or(-1));
    Ok(u32::from(!o.status.success()))
}

/// This month, YYYY-MM (UTC).
fn chrono_month() -> Result<String> {
    let o = std::process::Command::new("date")
        .args(["-u", "+%Y-%m"])
        .output()?;
    Ok(text(&o.stdout).trim().to_string())
}
