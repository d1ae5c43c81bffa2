//! The Debian packages `scripts/package` builds: installed with dpkg into a fresh Debian root
//! (debootstrap, cached under /var/cache/slurm-tenancy), their files and units in place and
//! `tenancyctl check` running there; and an upgrade with a job running, whose isolation the
//! new package's epilog then tears down from the old package's journal.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tenancy_e2e::require_root;

const CACHE: &str = "/var/cache/slurm-tenancy";
/// What the packages depend on, in the root before they are installed (and what the job path
/// uses there: nft, useradd).
const ROOT_PACKAGES: &str =
    "slurmd,slurmctld,slurm-client,munge,nftables,netbase,libpam0g,procps,iproute2";

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn ok(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {}", text(&out));
    out
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The mirror this machine's apt uses (deb822 `URIs:` or a `deb` line), for debootstrap.
fn mirror() -> String {
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(rd) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut more: Vec<PathBuf> = rd.map(|e| e.unwrap().path()).collect();
        more.sort();
        files.extend(more);
    }
    for f in files {
        let Ok(t) = std::fs::read_to_string(&f) else {
            continue;
        };
        for l in t.lines() {
            let words: Vec<&str> = l.split_whitespace().collect();
            let uri = match words.as_slice() {
                ["URIs:", uri, ..] => uri,
                ["deb", uri, suite, ..]
                    if !uri.starts_with('[') && suite.starts_with("bookworm") =>
                {
                    uri
                }
                _ => continue,
            };
            if uri.contains("debian") && !uri.contains("security") {
                return uri.to_string();
            }
        }
    }
    "http://deb.debian.org/debian".into()
}

/// A fresh copy of the cached Debian 12 root (made by debootstrap when missing). None: skip.
fn clean_root(into: &Path) -> Option<PathBuf> {
    if Command::new("debootstrap")
        .arg("--version")
        .output()
        .is_err()
    {
        if std::env::var_os("CI").is_some() {
            panic!("debootstrap missing: apt-get install debootstrap");
        }
        eprintln!("SKIP (needs debootstrap): apt-get install debootstrap");
        return None;
    }
    std::fs::create_dir_all(CACHE).unwrap();
    let cached = Path::new(CACHE).join("root-bookworm");
    // One test makes it (again when the package list changed); the other waits on the lock
    // and copies it.
    let script = format!(
        "set -e; [ \"$(cat {c}/.complete 2>/dev/null)\" = {p} ] && exit 0; rm -rf {c}.new; \
         debootstrap --variant=minbase --include={p} bookworm {c}.new {m} >&2; \
         echo {p} > {c}.new/.complete; rm -rf {c}; mv {c}.new {c}",
        c = cached.display(),
        p = ROOT_PACKAGES,
        m = mirror()
    );
    ok(Command::new("flock")
        .arg(format!("{CACHE}/.lock"))
        .args(["sh", "-c", &script]));
    let root = into.join("root");
    ok(Command::new("cp").arg("-a").arg(&cached).arg(&root));
    Some(root)
}

/// `scripts/package --debug --no-build --version V --out DIR` over this build's binaries.
fn packages(version: &str, out: &Path) -> Vec<PathBuf> {
    let target = tenancy_e2e::target_dir();
    let profile = target.file_name().unwrap().to_string_lossy().into_owned();
    let mut cmd = Command::new(repo().join("scripts/package"));
    if profile == "debug" {
        cmd.arg("--debug");
    }
    cmd.args(["--no-build", "--version", version, "--out"])
        .arg(out)
        .env("CARGO_TARGET_DIR", target.parent().unwrap());
    ok(&mut cmd);
    let mut debs: Vec<PathBuf> = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    debs.sort();
    debs
}

/// Mounts /proc, /sys and /dev into `root` for the job path's cgroups and nft; unmounted on
/// drop, and only then the test's folder (holding the root's copy) removed: were a mount still
/// there, removing the folder would remove the host's /dev, so it is kept instead.
struct Chroot {
    root: PathBuf,
    mounted: Vec<PathBuf>,
    folder: Option<tempfile::TempDir>,
}

impl Chroot {
    fn new(root: PathBuf, folder: tempfile::TempDir) -> Chroot {
        let mut c = Chroot {
            root,
            mounted: Vec::new(),
            folder: Some(folder),
        };
        for m in ["proc", "sys", "dev"] {
            let at = c.root.join(m);
            ok(Command::new("mount")
                .args(["--rbind", &format!("/{m}")])
                .arg(&at));
            ok(Command::new("mount").args(["--make-rslave"]).arg(&at));
            c.mounted.push(at);
        }
        c
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("chroot");
        c.arg(&self.root).args(args).env_clear().env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        );
        c
    }

    fn dpkg_install(&self, debs: &[PathBuf]) -> Output {
        let inbox = self.root.join("tmp/debs");
        let _ = std::fs::remove_dir_all(&inbox);
        std::fs::create_dir_all(&inbox).unwrap();
        let mut args = vec!["dpkg".to_string(), "--force-confold".into(), "-i".into()];
        for d in debs {
            std::fs::copy(d, inbox.join(d.file_name().unwrap())).unwrap();
            args.push(format!(
                "/tmp/debs/{}",
                d.file_name().unwrap().to_string_lossy()
            ));
        }
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        self.cmd(&a)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output()
            .unwrap()
    }
}

impl Drop for Chroot {
    fn drop(&mut self) {
        for m in self.mounted.iter().rev() {
            let _ = Command::new("umount").arg("-R").arg("-l").arg(m).status();
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let root = self.root.display().to_string();
        if mounts.is_empty() || mounts.contains(&format!(" {root}/")) {
            let kept = self.folder.take().map(tempfile::TempDir::keep);
            eprintln!("mounts under {root} remain: {kept:?} kept, remove it by hand");
        }
    }
}

#[test]
fn packages_install_into_a_clean_root() {
    if !require_root("dpkg -i into a debootstrap root") {
        return;
    }
    let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
    let debs = packages("0.1.0-1", &tmp.path().join("debs"));
    let names: Vec<String> = debs
        .iter()
        .map(|d| d.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for p in [
        "slurm-tenancy_",
        "slurm-tenancy-spank_",
        "slurm-tenancy-job-submit_",
        "libpam-tenancy_",
    ] {
        assert!(
            names.iter().any(|n| n.starts_with(p)),
            "{p} missing: {names:?}"
        );
    }
    // The job_submit plugin depends on exactly the Slurm release it was built for.
    let fields = ok(Command::new("dpkg-deb")
        .args(["-f"])
        .arg(
            debs.iter()
                .find(|d| names_of(d).starts_with("slurm-tenancy-job-submit_"))
                .unwrap(),
        )
        .args(["Depends", "Breaks"]));
    let fields = String::from_utf8_lossy(&fields.stdout).into_owned();
    assert!(fields.contains("slurmctld (>= 22.05.8)"), "{fields}");
    assert!(
        fields.contains("| slurm-smd-slurmctld (>= 22.05.8)"),
        "{fields}"
    );
    assert!(fields.contains("slurmctld (>= 22.05.9~)"), "{fields}");

    lintian(&debs);

    let Some(root) = clean_root(tmp.path()) else {
        return;
    };
    let chroot = Chroot::new(root.clone(), tmp);
    let out = chroot.dpkg_install(&debs);
    assert!(out.status.success(), "dpkg -i: {}", text(&out));
    for f in [
        "usr/bin/tenancyctl",
        "usr/sbin/tenancy-prolog",
        "usr/sbin/tenancy-epilog",
        "usr/sbin/tenancy-prolog-dynamic",
        "lib/systemd/system/tenancy-firewall.service",
        "lib/systemd/system/tenancy-reconcile.service",
        "lib/systemd/system/tenancy-audit-rotate.timer",
        "lib/systemd/system/tenancy-metrics.timer",
        "lib/systemd/system/tenancy-audit-forward.service",
        "lib/systemd/system/tenancy-audit-prune.timer",
        "usr/share/doc/slurm-tenancy/audit.md",
        // The node's own key that signs its anchors, made at install (postinst).
        "var/lib/slurm-tenancy/jobs/audit-signing.key",
        "etc/slurm/tenancy.toml",
        "etc/slurm/plugstack.conf.d/tenancy.conf",
        "usr/lib/x86_64-linux-gnu/slurm-tenancy/spank_tenancy.so",
        "usr/lib/x86_64-linux-gnu/slurm-wlm/job_submit_tenancy.so",
        "lib/x86_64-linux-gnu/security/pam_tenancy.so",
        "var/lib/slurm-tenancy/jobs",
    ] {
        assert!(root.join(f).exists(), "{f} not installed");
    }
    // The drop-in names the installed plugin, and Debian's plugstack.conf includes it.
    let dropin =
        std::fs::read_to_string(root.join("etc/slurm/plugstack.conf.d/tenancy.conf")).unwrap();
    assert!(dropin.contains("required /usr/lib/x86_64-linux-gnu/slurm-tenancy/spank_tenancy.so"));
    let plugstack = std::fs::read_to_string(root.join("etc/slurm/plugstack.conf")).unwrap();
    assert!(plugstack.contains("plugstack.conf.d/"), "{plugstack}");
    // Units enabled on the first install: the firewall before slurmd starts.
    assert!(
        // A link to /lib/systemd/system/..., which resolves inside the root only.
        root.join("etc/systemd/system/slurmd.service.requires/tenancy-firewall.service")
            .symlink_metadata()
            .is_ok(),
        "tenancy-firewall.service not enabled"
    );
    // tenancyctl runs there, on the packaged example config.
    let out = ok(&mut chroot.cmd(&["tenancyctl", "check"]));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("acme"),
        "{}",
        text(&out)
    );
    // Removal leaves no file of the packages but the config (a conffile) until purge.
    let out = chroot
        .cmd(&[
            "dpkg",
            "--purge",
            "libpam-tenancy",
            "slurm-tenancy-job-submit",
            "slurm-tenancy-spank",
            "slurm-tenancy",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "dpkg --purge: {}", text(&out));
    assert!(!root.join("usr/bin/tenancyctl").exists());
    assert!(!root
        .join("etc/slurm/plugstack.conf.d/tenancy.conf")
        .exists());
    drop(chroot);
}

/// lintian over the packages: no error, and only the warnings README explains.
fn lintian(debs: &[PathBuf]) {
    const EXPLAINED: [&str; 4] = [
        "no-manual-page",
        "shared-library-lacks-prerequisites",
        "systemd-service-file-refers-to-unusual-wantedby-target",
        "initial-upload-closes-no-bugs",
    ];
    let Ok(out) = Command::new("lintian")
        .args(["--tag-display-limit", "0"])
        .args(debs)
        .output()
    else {
        if std::env::var_os("CI").is_some() {
            panic!("lintian missing: apt-get install lintian");
        }
        eprintln!("SKIP lintian (not installed): apt-get install lintian");
        return;
    };
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    for l in said.lines() {
        let tag = l.split_whitespace().nth(2).unwrap_or("");
        assert!(
            !l.starts_with("E:") && (!l.starts_with("W:") || EXPLAINED.contains(&tag)),
            "lintian: {l}\n{said}"
        );
    }
}

fn names_of(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn package_upgrade_keeps_running_jobs_torn_down() {
    if !require_root("dpkg -i into a debootstrap root, cgroups and nft for a job") {
        return;
    }
    let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
    let old = packages("0.1.0-1", &tmp.path().join("old"));
    let new = packages("0.1.0-2", &tmp.path().join("new"));
    let Some(root) = clean_root(tmp.path()) else {
        return;
    };
    let chroot = Chroot::new(root.clone(), tmp);
    let out = chroot.dpkg_install(&old);
    assert!(out.status.success(), "dpkg -i (old): {}", text(&out));

    // A node config of the test's (the admin's edit of the conffile: kept by the upgrade).
    let tag = format!("up{}", std::process::id());
    let user = format!("{tag}u");
    ok(&mut chroot.cmd(&["groupadd", &tag]));
    ok(&mut chroot.cmd(&[
        "useradd",
        "-M",
        "-N",
        "-g",
        &tag,
        "-s",
        "/usr/sbin/nologin",
        &user,
    ]));
    let config = format!(
        "[cluster]\nname = \"up\"\nstate_dir = \"/var/lib/slurm-tenancy/jobs\"\n\
         audit_log = \"/var/log/slurm-tenancy/audit.jsonl\"\nscratch_root = \"/scratch\"\n\
         [tiers.internal]\n[tenants.{tag}]\ntier = \"internal\"\ngroups = [\"{tag}\"]\n"
    );
    std::fs::write(root.join("etc/slurm/tenancy.toml"), &config).unwrap();
    std::fs::create_dir_all(root.join("scratch")).unwrap();
    let netns = tag.clone();
    ok(Command::new("ip").args(["netns", "add", &netns]));
    struct Net(String, String);
    impl Drop for Net {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
            for d in ["unified", "freezer", "devices"] {
                let _ = std::fs::remove_dir(format!("/sys/fs/cgroup/{d}/tenancy/{}", self.1));
            }
        }
    }
    let _net = Net(netns.clone(), tag.clone());
    // What slurmd runs, in the node's network namespace.
    let in_node = |args: &[&str], env: &[(&str, String)]| -> Output {
        let mut c = Command::new("/usr/bin/nsenter");
        c.arg(format!("--net=/run/netns/{netns}"))
            .arg("/usr/sbin/chroot")
            .arg(&root)
            .args(args)
            .env_clear();
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let out = in_node(&["/usr/bin/tenancyctl", "firewall", "apply"], &[]);
    assert!(out.status.success(), "firewall apply: {}", text(&out));

    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
    let entry = passwd
        .lines()
        .find(|l| l.starts_with(&format!("{user}:")))
        .unwrap();
    let f: Vec<&str> = entry.split(':').collect();
    let job = 7_800_000 + u64::from(std::process::id() % 100_000);
    let env = vec![
        ("SLURM_JOB_ID", job.to_string()),
        ("SLURM_JOB_UID", f[2].to_string()),
        ("SLURM_JOB_GID", f[3].to_string()),
        ("SLURM_JOB_USER", user.clone()),
        ("SLURMD_NODENAME", "n1".to_string()),
        ("SLURM_CLUSTER_NAME", "up".to_string()),
        ("SPANK_TENANCY_TENANT", tag.clone()),
    ];
    let out = in_node(&["/usr/sbin/tenancy-prolog"], &env);
    assert!(out.status.success(), "old prolog: {}", text(&out));
    let cgroup = PathBuf::from(format!("/sys/fs/cgroup/unified/tenancy/{tag}/job_{job}"));
    let scratch = root.join(format!("scratch/{tag}/job_{job}"));
    let journal = root.join(format!("var/lib/slurm-tenancy/jobs/job_{job}.json"));
    assert!(cgroup.is_dir() && scratch.is_dir() && journal.is_file());

    // The upgrade, with the job running: its isolation stays in place.
    let epilog = root.join("usr/sbin/tenancy-epilog");
    let before = std::fs::metadata(&epilog).unwrap();
    let out = chroot.dpkg_install(&new);
    assert!(out.status.success(), "dpkg -i (new): {}", text(&out));
    let status = ok(&mut chroot.cmd(&["dpkg-query", "-W", "-f", "${Version}", "slurm-tenancy"]));
    assert_eq!(String::from_utf8_lossy(&status.stdout), "0.1.0-2");
    use std::os::unix::fs::MetadataExt;
    assert_ne!(
        std::fs::metadata(&epilog).unwrap().ino(),
        before.ino(),
        "dpkg did not replace the epilog"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("etc/slurm/tenancy.toml")).unwrap(),
        config,
        "the upgrade replaced the admin's config"
    );
    assert!(cgroup.is_dir() && scratch.is_dir() && journal.is_file());
    let table = ok(Command::new("/usr/bin/nsenter")
        .arg(format!("--net=/run/netns/{netns}"))
        .args(["/usr/sbin/nft", "list", "table", "inet", "tenancy"]));
    assert!(String::from_utf8_lossy(&table.stdout).contains(&format!("drop_{tag}")));

    // The new epilog tears the old prolog's job down.
    let out = in_node(&["/usr/sbin/tenancy-epilog"], &env);
    assert!(out.status.success(), "new epilog: {}", text(&out));
    assert!(!cgroup.exists(), "cgroup left");
    assert!(!scratch.exists(), "scratch left");
    assert!(!journal.exists(), "journal left");
    let log = std::fs::read_to_string(root.join("var/log/slurm-tenancy/audit.jsonl")).unwrap();
    let events: Vec<String> = log
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            format!(
                "{} {}",
                v["event"].as_str().unwrap(),
                v["outcome"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(events, ["job_start success", "job_end success"], "{log}");
    let out = in_node(
        &[
            "/usr/bin/tenancyctl",
            "audit",
            "verify",
            "/var/log/slurm-tenancy/audit.jsonl",
        ],
        &[],
    );
    assert!(out.status.success(), "audit verify: {}", text(&out));
    drop(chroot);
}
