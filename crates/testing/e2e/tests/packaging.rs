//! The Debian packages `scripts/package` builds: installed with dpkg into a fresh Debian root
//! (debootstrap, cached under /var/cache/slurm-tenancy or TENANCY_ROOTS_DIR), their files and units in place and
//! `tenancyctl check` running there; and an upgrade with a job running, whose isolation the
//! new package's epilog then tears down from the old package's journal.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tenancy_e2e::{requires_root, skip};
use tenancy_test_support::output_text;

/// Where the clean Debian 12 root is cached: beside the release roots when a cache folder is
/// named for them (`TENANCY_ROOTS_DIR`, which .ci/run sets inside the clone), else the
/// machine's.
fn cache() -> PathBuf {
    std::env::var_os("TENANCY_ROOTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/slurm-tenancy"))
}
/// What the packages depend on, in the root before they are installed (and what the job path
/// uses there: nft, useradd).
const ROOT_PACKAGES: &str =
    "slurmd,slurmctld,slurm-client,munge,nftables,netbase,libpam0g,procps,iproute2";

fn ok(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {}", output_text(&out));
    out
}

fn repo() -> PathBuf {
    tenancy_e2e::repo_root()
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
        skip("needs debootstrap", "apt-get install debootstrap");
        return None;
    }
    let cache = cache();
    std::fs::create_dir_all(&cache).unwrap();
    let cached = cache.join("root-bookworm");
    // One test makes it (again when the package list changed); the other waits on the lock
    // and copies it.
    ok(Command::new("flock")
        .arg(cache.join(".lock"))
        .args([
            "sh",
            "-c",
            include_str!("../scripts/bookworm-root.sh"),
            "root",
        ])
        .arg(&cached)
        .arg(ROOT_PACKAGES)
        .arg(mirror()));
    let root = into.join("root");
    ok(Command::new("cp").arg("-a").arg(&cached).arg(&root));
    Some(root)
}

/// A tool the packaging tests need, or None (SKIP, outside CI) with what installs it.
fn tool(name: &str, install: &str) -> Option<()> {
    if Command::new(name).arg("--version").output().is_ok() {
        return Some(());
    }
    if std::env::var_os("CI").is_some() {
        panic!("{name} missing: {install}");
    }
    eprintln!("SKIP (needs {name}): {install}");
    None
}

/// What the packages ship, built as they are shipped, for this test build's profile:
/// scripts/build-portable (glibc 2.28 at most; a no-op when up to date) next to this build's
/// target folder. None (SKIP outside CI) when its tools are not installed.
fn portable_build() -> Option<()> {
    static BUILT: std::sync::Mutex<Option<bool>> = std::sync::Mutex::new(None);
    let mut built = BUILT.lock().unwrap();
    if built.is_none() {
        let target = tenancy_e2e::target_dir();
        let mut cmd = Command::new(repo().join("scripts/build-portable"));
        if target.file_name().is_some_and(|p| p == "debug") {
            cmd.arg("--debug");
        }
        let out = cmd
            .env("CARGO_TARGET_DIR", target.parent().unwrap())
            .output()
            .unwrap();
        let said = output_text(&out);
        if !out.status.success() {
            if said.contains("run scripts/install-deps") && std::env::var_os("CI").is_none() {
                eprintln!("SKIP (zig, cargo-zigbuild): {said}");
            } else {
                panic!("scripts/build-portable: {said}");
            }
        }
        *built = Some(out.status.success());
    }
    built.unwrap().then_some(())
}

/// `scripts/package [--rpm] --debug --no-build --version V --out DIR` over this build's
/// binaries (scripts/build-portable's), sorted. Built once per format and version for all the
/// tests of this file, in target/<profile>/packaging-tests/ (made again by each run).
fn package_files(rpm: bool, version: &str) -> Vec<PathBuf> {
    type Built = std::collections::HashMap<(bool, String), Vec<PathBuf>>;
    static BUILT: std::sync::Mutex<Option<Built>> = std::sync::Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let built = built.get_or_insert_with(Built::new);
    if let Some(files) = built.get(&(rpm, version.to_string())) {
        return files.clone();
    }
    let target = tenancy_e2e::target_dir();
    let profile = target.file_name().unwrap().to_string_lossy().into_owned();
    let out = target
        .join("packaging-tests")
        .join(format!("{}-{version}", if rpm { "rpm" } else { "deb" }));
    let mut cmd = Command::new(repo().join("scripts/package"));
    if rpm {
        cmd.arg("--rpm");
    }
    if profile == "debug" {
        cmd.arg("--debug");
    }
    cmd.args(["--no-build", "--version", version, "--out"])
        .arg(&out)
        .env("CARGO_TARGET_DIR", target.parent().unwrap());
    ok(&mut cmd);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    built.insert((rpm, version.to_string()), files.clone());
    files
}

/// The .debs (scripts/package), over scripts/build-portable's build.
fn packages(version: &str) -> Vec<PathBuf> {
    portable_build().expect("scripts/build-portable's tools: run scripts/install-deps");
    package_files(false, version)
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
    if !requires_root("dpkg -i into a debootstrap root") {
        return;
    }
    let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
    let debs = packages("0.1.0-1");
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
    assert!(out.status.success(), "dpkg -i: {}", output_text(&out));
    for f in [
        "usr/bin/tenancyctl",
        "usr/sbin/tenancy-prolog",
        "usr/sbin/tenancy-epilog",
        "usr/sbin/tenancy-prolog-dynamic",
        "lib/systemd/system/tenancy-firewall.service",
        "lib/systemd/system/tenancy-reconcile.service",
        "lib/systemd/system/tenancy-reconcile.timer",
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
        output_text(&out)
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
    assert!(out.status.success(), "dpkg --purge: {}", output_text(&out));
    assert!(!root.join("usr/bin/tenancyctl").exists());
    assert!(!root
        .join("etc/slurm/plugstack.conf.d/tenancy.conf")
        .exists());
    drop(chroot);
}

/// lintian over the packages: no error, and only the warnings docs/admin-guide.md explains.
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
        skip("needs lintian", "apt-get install lintian");
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
    if !requires_root("dpkg -i into a debootstrap root, cgroups and nft for a job") {
        return;
    }
    let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
    let old = packages("0.1.0-1");
    let new = packages("0.1.0-2");
    let Some(root) = clean_root(tmp.path()) else {
        return;
    };
    let chroot = Chroot::new(root.clone(), tmp);
    let out = chroot.dpkg_install(&old);
    assert!(out.status.success(), "dpkg -i (old): {}", output_text(&out));

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
        "[cluster]\nname = \"demo\"\nstate_dir = \"/var/lib/slurm-tenancy/jobs\"\n\
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
    assert!(
        out.status.success(),
        "firewall apply: {}",
        output_text(&out)
    );

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
        // The node's chain, begun at install (its signing key) under the packaged config's
        // cluster and the host's name, goes on under the same names (docs/known-gaps.md).
        ("SLURMD_NODENAME", short_hostname()),
        ("SLURM_CLUSTER_NAME", "demo".to_string()),
        ("SPANK_TENANCY_TENANT", tag.clone()),
    ];
    let out = in_node(&["/usr/sbin/tenancy-prolog"], &env);
    assert!(out.status.success(), "old prolog: {}", output_text(&out));
    let cgroup = PathBuf::from(format!("/sys/fs/cgroup/unified/tenancy/{tag}/job_{job}"));
    let scratch = root.join(format!("scratch/{tag}/job_{job}"));
    let journal = root.join(format!("var/lib/slurm-tenancy/jobs/job_{job}.json"));
    assert!(cgroup.is_dir() && scratch.is_dir() && journal.is_file());

    // The upgrade, with the job running: its isolation stays in place.
    let epilog = root.join("usr/sbin/tenancy-epilog");
    let before = std::fs::metadata(&epilog).unwrap();
    let out = chroot.dpkg_install(&new);
    assert!(out.status.success(), "dpkg -i (new): {}", output_text(&out));
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
    assert!(out.status.success(), "new epilog: {}", output_text(&out));
    assert!(!cgroup.exists(), "cgroup left");
    assert!(!scratch.exists(), "scratch left");
    assert!(!journal.exists(), "journal left");
    let log = std::fs::read_to_string(root.join("var/log/slurm-tenancy/audit.jsonl")).unwrap();
    // The node's own records (its signing key made at install, the admin commands the
    // packages ran) sit beside the job's; the job's are one start and one end.
    let events: Vec<String> = log
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("job_id").is_some())
        .map(|v| {
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
    assert!(out.status.success(), "audit verify: {}", output_text(&out));
    drop(chroot);
}

// ---- The RPMs (scripts/package --rpm, packaging/rpm/slurm-tenancy.spec) and what both
// formats ship: every ELF needs at most glibc 2.28 (RHEL 8), the same files in both.

/// The oldest glibc the packages load with (scripts/build-portable): RHEL 8's.
const GLIBC_BASELINE: (u32, u32) = (2, 28);

/// The .deb package and the RPM package that ship the same files.
const PACKAGE_PAIRS: [(&str, &str); 4] = [
    ("slurm-tenancy", "slurm-tenancy"),
    ("slurm-tenancy-spank", "slurm-tenancy-spank"),
    ("slurm-tenancy-job-submit", "slurm-tenancy-job-submit"),
    ("libpam-tenancy", "pam_tenancy"),
];

/// The release of the Slurm headers the plugins are built against, e.g. "22.05.8".
fn slurm_release() -> String {
    let dir = std::env::var("SLURM_INCLUDE_DIR").unwrap_or_else(|_| "/usr/include".into());
    let text = std::fs::read_to_string(Path::new(&dir).join("slurm/slurm_version.h")).unwrap();
    let hex = text
        .lines()
        .find_map(|l| l.strip_prefix("#define SLURM_VERSION_NUMBER"))
        .map(|v| v.trim().trim_start_matches("0x"))
        .unwrap();
    let n = u32::from_str_radix(hex, 16).unwrap();
    format!("{}.{:02}.{}", n >> 16, (n >> 8) & 0xff, n & 0xff)
}

/// The RPMs, or None (SKIP outside CI) without rpmbuild or scripts/build-portable's tools.
fn rpm_packages(version: &str) -> Option<Vec<PathBuf>> {
    tool("rpmbuild", "apt-get install rpm")?;
    portable_build()?;
    Some(package_files(true, version))
}

/// The RPM file of package `name` among `rpms`.
fn rpm_of<'a>(rpms: &'a [PathBuf], name: &str) -> &'a Path {
    rpms.iter()
        .find(|r| {
            let q = ok(Command::new("rpm").args(["-qp", "--qf", "%{NAME}"]).arg(r));
            String::from_utf8_lossy(&q.stdout) == name
        })
        .unwrap_or_else(|| panic!("no RPM of {name} among {rpms:?}"))
}

/// Whether `line` is one of the lines of `text`.
fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

/// `rpm -qp --qf '[%{FILENAMES} %{FILEFLAGS:fflags}\n]'` of `file`: each file and its flags.
fn file_flags(file: &Path) -> String {
    rpm_query(file, &["--qf", "[%{FILENAMES} %{FILEFLAGS:fflags}\n]"])
}

/// `rpm -qp ARGS FILE`'s output.
fn rpm_query(file: &Path, args: &[&str]) -> String {
    let out = ok(Command::new("rpm").arg("-qp").args(args).arg(file));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every package's files unpacked into `into/<package>`: the .debs with dpkg-deb, the RPMs
/// with rpm2cpio and cpio.
fn unpack(packages: &[PathBuf], into: &Path) -> Vec<(String, PathBuf)> {
    let mut unpacked = Vec::new();
    for p in packages {
        let rpm = p.extension().is_some_and(|e| e == "rpm");
        let name = if rpm {
            rpm_query(p, &["--qf", "%{NAME}"])
        } else {
            let out = ok(Command::new("dpkg-deb").args(["-f"]).arg(p).arg("Package"));
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        let dir = into.join(&name);
        std::fs::create_dir_all(&dir).unwrap();
        if rpm {
            ok(Command::new("sh")
                .args([
                    "-c",
                    "rpm2cpio \"$1\" | (cd \"$2\" && cpio -idm --quiet)",
                    "sh",
                ])
                .arg(p)
                .arg(&dir));
        } else {
            ok(Command::new("dpkg-deb").arg("-x").arg(p).arg(&dir));
        }
        unpacked.push((name, dir));
    }
    unpacked
}

/// Every file under `dir` (not folders), relative to it, sorted.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    fn walk(base: &Path, at: &Path, found: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(at).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                walk(base, &e.path(), found);
            } else {
                found.push(e.path().strip_prefix(base).unwrap().to_path_buf());
            }
        }
    }
    let mut found = Vec::new();
    walk(dir, dir, &mut found);
    found.sort();
    found
}

/// The RPMs build, carry SchedMD's package names, the job_submit plugin's tie to the Slurm
/// release it was built against (its release names it, its requirement is exact), the config
/// as %config(noreplace) and the units' scriptlets; rpmlint finds no error and only the
/// warnings docs/packages.md explains.
#[test]
fn rpms_build_and_lint() {
    let Some(rpms) = rpm_packages("0.1.0-1") else {
        return;
    };
    let slurm = slurm_release();
    let major = slurm.rsplit_once('.').unwrap().0.to_string();
    let arch = std::env::consts::ARCH;
    let names: Vec<String> = rpms.iter().map(|r| names_of(r)).collect();
    assert_eq!(
        names,
        [
            format!("pam_tenancy-0.1.0-1.{arch}.rpm"),
            format!("slurm-tenancy-0.1.0-1.{arch}.rpm"),
            format!("slurm-tenancy-job-submit-0.1.0-1.slurm{slurm}.{arch}.rpm"),
            format!("slurm-tenancy-spank-0.1.0-1.{arch}.rpm"),
        ]
    );

    let main = rpm_of(&rpms, "slurm-tenancy");
    let requires = rpm_query(main, &["--requires"]);
    for r in ["slurm-slurmd", "nftables"] {
        assert!(has_line(&requires, r), "{r}: {requires}");
    }
    // The example config is %config(noreplace): an admin's edits survive upgrades.
    let flags = file_flags(main);
    assert!(has_line(&flags, "/etc/slurm/tenancy.toml cn"), "{flags}");
    // The units' scriptlets: enabled (preset) on the first install only, disabled on removal.
    let scripts = rpm_query(main, &["--scripts"]);
    let units = "tenancy-firewall.service tenancy-reconcile.service tenancy-reconcile.timer \
                 tenancy-audit-rotate.timer tenancy-metrics.timer";
    assert!(
        scripts.contains(&format!("systemctl --no-reload preset {units}")),
        "{scripts}"
    );
    assert!(
        scripts.contains(&format!("systemctl --no-reload disable {units}")),
        "{scripts}"
    );
    assert!(
        scripts.contains("postinstall scriptlet") && scripts.contains("if [ \"$1\" -eq 1 ]"),
        "{scripts}"
    );
    let preset = rpm_query(main, &["--list"]);
    assert!(
        has_line(
            &preset,
            "/usr/lib/systemd/system-preset/80-slurm-tenancy.preset"
        ),
        "{preset}"
    );

    let spank = rpm_of(&rpms, "slurm-tenancy-spank");
    let requires = rpm_query(spank, &["--requires"]);
    assert!(
        has_line(&requires, &format!("slurm >= {major}")),
        "{requires}"
    );
    assert!(
        has_line(&requires, "slurm-tenancy(x86-64) = 0.1.0-1"),
        "{requires}"
    );
    let conflicts = rpm_query(spank, &["--conflicts"]);
    let (y, m) = major.split_once('.').unwrap();
    let next = format!("{y}.{:02}", m.parse::<u32>().unwrap() + 1);
    assert_eq!(conflicts.trim(), format!("slurm >= {next}"));
    let flags = file_flags(spank);
    assert!(
        has_line(&flags, "/etc/slurm/plugstack.conf.d/tenancy.conf cn"),
        "{flags}"
    );

    // Tied to the Slurm release it was built against, the way pyxis's RPMs are.
    let job_submit = rpm_of(&rpms, "slurm-tenancy-job-submit");
    assert_eq!(
        rpm_query(job_submit, &["--qf", "%{RELEASE}"]),
        format!("1.slurm{slurm}")
    );
    let requires = rpm_query(job_submit, &["--requires"]);
    assert!(
        has_line(&requires, &format!("slurm-slurmctld = {slurm}")),
        "{requires}"
    );
    assert!(
        has_line(&requires, "slurm-tenancy(x86-64) = 0.1.0-1"),
        "{requires}"
    );
    let pam = rpm_of(&rpms, "pam_tenancy");
    assert!(has_line(&rpm_query(pam, &["--requires"]), "pam"));

    // slurm-devel at build, in the spec (a binary RPM does not record it).
    let spec = repo().join("packaging/rpm/slurm-tenancy.spec");
    let out = ok(Command::new("rpmspec")
        .args(["-q", "--buildrequires"])
        .args(["--define", "pkg_version 0.1.0", "--define", "pkg_release 1"])
        .args([
            "--define",
            "slurm_release 1.1.1",
            "--define",
            "slurm_major 1.1",
        ])
        .args(["--define", "slurm_next_major 1.2"])
        .arg(&spec));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "slurm-devel");

    rpmlint(&rpms);
}

/// rpmlint over the RPMs with packaging/rpm/rpmlint.toml: no error, and only the warnings
/// docs/packages.md explains (and the errors that file filters, explained there too).
fn rpmlint(rpms: &[PathBuf]) {
    const EXPLAINED: [&str; 6] = [
        "requires-on-release",
        "only-non-binary-in-usr-lib",
        "no-manual-page-for-binary",
        "no-documentation",
        "log-files-without-logrotate",
        "invalid-license",
    ];
    const FILTERED: [&str; 3] = [
        "statically-linked-binary",
        "non-standard-dir-perm",
        "no-signature",
    ];
    let docs = std::fs::read_to_string(repo().join("docs/packages.md")).unwrap();
    for tag in EXPLAINED.iter().chain(&FILTERED) {
        assert!(
            docs.contains(&format!("`{tag}`")),
            "docs/packages.md does not explain rpmlint's {tag}"
        );
    }
    let config = std::fs::read_to_string(repo().join("packaging/rpm/rpmlint.toml")).unwrap();
    let filtered: Vec<&str> = config
        .lines()
        .filter_map(|l| l.trim().strip_prefix('"')?.strip_suffix("\","))
        .collect();
    assert_eq!(filtered, FILTERED, "packaging/rpm/rpmlint.toml");
    let Some(()) = tool("rpmlint", "apt-get install rpmlint") else {
        return;
    };
    let out = Command::new("rpmlint")
        .arg("-c")
        .arg(repo().join("packaging/rpm/rpmlint.toml"))
        .args(rpms)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(said.contains(" 0 errors,"), "rpmlint: {said}");
    for l in said.lines() {
        let mut w = l.split_whitespace();
        let (Some(_), Some(level), Some(tag)) = (w.next(), w.next(), w.next()) else {
            continue;
        };
        assert!(level != "E:", "rpmlint: {l}\n{said}");
        if level == "W:" {
            assert!(EXPLAINED.contains(&tag), "rpmlint: {l}\n{said}");
        }
    }
}

/// `major.minor` of a symbol version such as GLIBC_2.28 or GLIBC_2.2.5.
fn glibc_version(v: &str) -> Option<(u32, u32)> {
    let mut parts = v.strip_prefix("GLIBC_")?.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// Every ELF file in the .debs and the RPMs needs at most glibc 2.28 (RHEL 8): the glibc
/// versions its symbols need (readelf's version needs, `.gnu.version_r`) are all at most
/// that, and the prolog and epilog are static (no program interpreter, no shared library).
#[test]
fn every_elf_needs_glibc_2_28_at_most() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(rpms) = rpm_packages("0.1.0-1") else {
        return;
    };
    let debs = package_files(false, "0.1.0-1");
    let static_ones = ["tenancy-prolog", "tenancy-epilog"];
    let expected = [
        "pam_tenancy.so",
        "job_submit_tenancy.so",
        "spank_tenancy.so",
        "tenancy-epilog",
        "tenancy-prolog",
        "tenancy-prolog-dynamic",
        "tenancyctl",
    ];
    for (format, packages) in [("deb", &debs), ("rpm", &rpms)] {
        let mut seen = Vec::new();
        for (pkg, dir) in unpack(packages, &tmp.path().join(format!("{format}-files"))) {
            for f in files_under(&dir) {
                let path = dir.join(&f);
                let mut magic = [0u8; 4];
                use std::io::Read;
                let n = std::fs::File::open(&path)
                    .and_then(|mut h| h.read(&mut magic))
                    .unwrap_or(0);
                if n < 4 || &magic != b"\x7fELF" {
                    continue;
                }
                let name = f.file_name().unwrap().to_string_lossy().into_owned();
                let what = format!("{format} {pkg}: /{}", f.display());
                let readelf = |flag: &str| -> String {
                    let out = ok(Command::new("readelf").args(["-W", flag]).arg(&path));
                    String::from_utf8_lossy(&out.stdout).into_owned()
                };
                let versions = readelf("--version-info");
                let needs = versions
                    .split("Version needs section")
                    .nth(1)
                    .unwrap_or("")
                    .split("Version definition section")
                    .next()
                    .unwrap();
                let glibc: Vec<(u32, u32)> =
                    needs.split_whitespace().filter_map(glibc_version).collect();
                let dynamic = readelf("-d");
                let needed: Vec<&str> = dynamic
                    .lines()
                    .filter(|l| l.contains("(NEEDED)"))
                    .filter_map(|l| l.split('[').nth(1)?.split(']').next())
                    .collect();
                let interp = readelf("-l").contains("Requesting program interpreter");
                if static_ones.contains(&name.as_str()) {
                    assert!(
                        needed.is_empty() && !interp && glibc.is_empty(),
                        "{what} is not static: NEEDED {needed:?}, interpreter {interp}"
                    );
                } else {
                    // A dynamically linked file whose needs the check reads.
                    assert!(
                        needed.contains(&"libc.so.6") && !glibc.is_empty(),
                        "{what}: NEEDED {needed:?}, glibc versions {glibc:?}"
                    );
                    let max = glibc.iter().max().unwrap();
                    assert!(
                        *max <= GLIBC_BASELINE,
                        "{what} needs glibc {}.{} (at most {}.{} for RHEL 8): build it with \
                         scripts/build-portable",
                        max.0,
                        max.1,
                        GLIBC_BASELINE.0,
                        GLIBC_BASELINE.1
                    );
                }
                seen.push(name);
            }
        }
        seen.sort();
        let mut want: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(seen, want, "{format}: the ELF files shipped");
    }
}

/// A copy of this machine's static busybox as `root`'s /bin/sh, for the RPMs' scriptlets
/// (rpm runs them chrooted into the root), or None (SKIP outside CI) without it.
fn static_shell(root: &Path) -> Option<()> {
    let busybox = Path::new("/bin/busybox");
    let linked = Command::new("readelf")
        .args(["-l"])
        .arg(busybox)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| !String::from_utf8_lossy(&o.stdout).contains("program interpreter"));
    if linked != Some(true) {
        if std::env::var_os("CI").is_some() {
            panic!("no static /bin/busybox: apt-get install busybox-static");
        }
        eprintln!("SKIP (needs a static /bin/busybox): apt-get install busybox-static");
        return None;
    }
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::copy(busybox, root.join("bin/sh")).unwrap();
    Some(())
}

/// The RPMs installed with `rpm --root DIR --nodeps -i` into an empty root (but a shell for
/// their scriptlets): the files, the units (enabled by the shipped preset, as %post's
/// `systemctl preset` does on a node), and `tenancyctl check` of the shipped example there;
/// then an upgrade keeps the admin's config (%config(noreplace)) and removal leaves it.
#[test]
fn rpm_installs_into_an_empty_root() {
    if !requires_root("rpm --root into an empty root") {
        return;
    }
    let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
    let Some(rpms) = rpm_packages("0.1.0-1") else {
        return;
    };
    let newer = package_files(true, "0.1.0-2");
    let root = tmp.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let Some(()) = static_shell(&root) else {
        return;
    };
    let rpm = |args: &[&str], files: &[PathBuf]| -> Output {
        let out = Command::new("rpm")
            .arg("--root")
            .arg(&root)
            .args(["--define", "_dbpath /var/lib/rpm"])
            .args(args)
            .args(files)
            .output()
            .unwrap();
        assert!(out.status.success(), "rpm {args:?}: {}", output_text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("scriptlet failed") && !stderr.contains("error:"),
            "rpm {args:?}: {}",
            output_text(&out)
        );
        out
    };
    rpm(&["--nodeps", "-i"], &rpms);
    let installed = rpm(&["-qa", "--qf", "%{NAME}\n"], &[]);
    let mut names: Vec<String> = String::from_utf8_lossy(&installed.stdout)
        .lines()
        .map(String::from)
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "pam_tenancy",
            "slurm-tenancy",
            "slurm-tenancy-job-submit",
            "slurm-tenancy-spank"
        ]
    );

    let lib = if cfg!(target_pointer_width = "64") {
        "usr/lib64"
    } else {
        "usr/lib"
    };
    for f in [
        "usr/bin/tenancyctl".to_string(),
        "usr/sbin/tenancy-prolog".into(),
        "usr/sbin/tenancy-epilog".into(),
        "usr/sbin/tenancy-prolog-dynamic".into(),
        "usr/lib/systemd/system/tenancy-firewall.service".into(),
        "usr/lib/systemd/system/tenancy-reconcile.service".into(),
        "usr/lib/systemd/system/tenancy-reconcile.timer".into(),
        "usr/lib/systemd/system/tenancy-audit-rotate.service".into(),
        "usr/lib/systemd/system/tenancy-audit-rotate.timer".into(),
        "usr/lib/systemd/system/tenancy-metrics.service".into(),
        "usr/lib/systemd/system/tenancy-metrics.timer".into(),
        "usr/lib/systemd/system-preset/80-slurm-tenancy.preset".into(),
        "etc/slurm/tenancy.toml".into(),
        "etc/slurm/plugstack.conf.d/tenancy.conf".into(),
        format!("{lib}/slurm-tenancy/spank_tenancy.so"),
        // SchedMD's PluginDir and the RHEL family's PAM module folder.
        format!("{lib}/slurm/job_submit_tenancy.so"),
        format!("{lib}/security/pam_tenancy.so"),
        "usr/share/doc/slurm-tenancy/README.md".into(),
        "usr/share/licenses/slurm-tenancy/COPYRIGHT".into(),
    ] {
        assert!(root.join(&f).is_file(), "{f} not installed");
    }
    use std::os::unix::fs::PermissionsExt;
    for (d, mode) in [
        ("var/lib/slurm-tenancy", 0o700),
        ("var/lib/slurm-tenancy/jobs", 0o700),
        ("var/log/slurm-tenancy", 0o750),
    ] {
        let m = std::fs::metadata(root.join(d)).unwrap_or_else(|e| panic!("{d}: {e}"));
        assert!(m.is_dir(), "{d}");
        assert_eq!(m.permissions().mode() & 0o7777, mode, "{d}");
    }
    let dropin =
        std::fs::read_to_string(root.join("etc/slurm/plugstack.conf.d/tenancy.conf")).unwrap();
    assert!(
        dropin.contains(&format!("required /{lib}/slurm-tenancy/spank_tenancy.so ")),
        "{dropin}"
    );

    // The units, enabled as %post's `systemctl preset` does on a systemd node: the firewall
    // before slurmd (slurmd does not start without it), reconcile, the timers.
    if tool("systemctl", "apt-get install systemd").is_some() {
        let units = [
            "tenancy-firewall.service",
            "tenancy-reconcile.service",
            "tenancy-reconcile.timer",
            "tenancy-audit-rotate.timer",
            "tenancy-metrics.timer",
        ];
        ok(Command::new("systemctl")
            .arg(format!("--root={}", root.display()))
            .arg("preset")
            .args(units));
        for link in [
            "etc/systemd/system/slurmd.service.requires/tenancy-firewall.service",
            "etc/systemd/system/slurmd.service.wants/tenancy-reconcile.service",
            "etc/systemd/system/timers.target.wants/tenancy-reconcile.timer",
            "etc/systemd/system/timers.target.wants/tenancy-audit-rotate.timer",
            "etc/systemd/system/timers.target.wants/tenancy-metrics.timer",
        ] {
            assert!(
                root.join(link).symlink_metadata().is_ok(),
                "{link}: not enabled by the preset"
            );
        }
    }

    // tenancyctl runs there, on the packaged example config.
    let out = ok(Command::new(root.join("usr/bin/tenancyctl"))
        .arg("--config")
        .arg(root.join("etc/slurm/tenancy.toml"))
        .arg("check")
        .env_clear());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("acme"),
        "{}",
        output_text(&out)
    );

    // An upgrade keeps the admin's config (%config(noreplace)) and replaces the binaries.
    let config = root.join("etc/slurm/tenancy.toml");
    let edited = format!(
        "{}\n# the admin's edit\n",
        std::fs::read_to_string(&config).unwrap()
    );
    std::fs::write(&config, &edited).unwrap();
    rpm(&["--nodeps", "-U"], &newer);
    let version = rpm(
        &["-q", "--qf", "%{VERSION}-%{RELEASE}", "slurm-tenancy"],
        &[],
    );
    assert_eq!(String::from_utf8_lossy(&version.stdout), "0.1.0-2");
    assert_eq!(std::fs::read_to_string(&config).unwrap(), edited);

    // Removal takes every file but the edited config (kept as .rpmsave).
    rpm(
        &["--nodeps", "-e"],
        &[
            "pam_tenancy",
            "slurm-tenancy-job-submit",
            "slurm-tenancy-spank",
            "slurm-tenancy",
        ]
        .map(PathBuf::from),
    );
    assert!(!root.join("usr/bin/tenancyctl").exists());
    assert!(!root
        .join(format!("{lib}/slurm/job_submit_tenancy.so"))
        .exists());
    assert!(!root
        .join("etc/slurm/plugstack.conf.d/tenancy.conf")
        .exists());
    assert_eq!(
        std::fs::read_to_string(root.join("etc/slurm/tenancy.toml.rpmsave")).unwrap(),
        edited
    );
}

/// Where a file of a .deb is in the RPM of the same package (the RHEL family's folders and
/// SchedMD's PluginDir), or None for what only a .deb has (Debian's changelog: the RPM's is in
/// its header).
fn rpm_path_of(deb_path: &str, deb_pkg: &str, rpm_pkg: &str) -> Option<String> {
    let multiarch = format!("{}-linux-gnu", std::env::consts::ARCH);
    let lib = "/usr/lib64";
    if deb_path == format!("/usr/share/doc/{deb_pkg}/changelog.Debian.gz") {
        return None;
    }
    if deb_path == format!("/usr/share/doc/{deb_pkg}/copyright") {
        return Some(format!("/usr/share/licenses/{rpm_pkg}/COPYRIGHT"));
    }
    for (from, to) in [
        (
            format!("/usr/lib/{multiarch}/slurm-wlm/"),
            format!("{lib}/slurm/"),
        ),
        (format!("/usr/lib/{multiarch}/"), format!("{lib}/")),
        (
            format!("/lib/{multiarch}/security/"),
            format!("{lib}/security/"),
        ),
        (
            "/lib/systemd/system/".into(),
            "/usr/lib/systemd/system/".into(),
        ),
    ] {
        if let Some(rest) = deb_path.strip_prefix(&from) {
            return Some(format!("{to}{rest}"));
        }
    }
    Some(deb_path.to_string())
}

/// The .debs and the RPMs ship the same files: each file of a .deb at its RPM place (the RHEL
/// family's folders), with the same bytes and mode (the drop-in naming its format's plugin
/// path), and the RPMs add only the preset that enables the units (the .deb's postinst does).
#[test]
fn rpm_and_deb_ship_the_same_files() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(rpms) = rpm_packages("0.1.0-1") else {
        return;
    };
    let debs = package_files(false, "0.1.0-1");
    let debs = unpack(&debs, &tmp.path().join("deb-files"));
    let rpms = unpack(&rpms, &tmp.path().join("rpm-files"));
    let multiarch = format!("/usr/lib/{}-linux-gnu/", std::env::consts::ARCH);
    assert_eq!(debs.len(), 4);
    assert_eq!(rpms.len(), 4);
    for (deb_pkg, rpm_pkg) in PACKAGE_PAIRS {
        let (_, deb_dir) = debs.iter().find(|(n, _)| n == deb_pkg).unwrap();
        let (_, rpm_dir) = rpms.iter().find(|(n, _)| n == rpm_pkg).unwrap();
        let mut rpm_files: Vec<String> = files_under(rpm_dir)
            .iter()
            .map(|f| format!("/{}", f.display()))
            .collect();
        let mut mapped = Vec::new();
        for f in files_under(deb_dir) {
            let deb_path = format!("/{}", f.display());
            let Some(rpm_path) = rpm_path_of(&deb_path, deb_pkg, rpm_pkg) else {
                continue;
            };
            let (d, r) = (
                deb_dir.join(&f),
                rpm_dir.join(rpm_path.trim_start_matches('/')),
            );
            assert!(
                r.is_file(),
                "{deb_pkg}'s {deb_path} is not in the RPM {rpm_pkg} at {rpm_path}: {rpm_files:?}"
            );
            use std::os::unix::fs::PermissionsExt;
            let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
            assert_eq!(mode(&d), mode(&r), "{deb_path}: mode");
            if !rpm_path.starts_with("/usr/share/licenses/") {
                let deb_bytes = std::fs::read(&d).unwrap();
                let rpm_bytes = std::fs::read(&r).unwrap();
                let same = deb_bytes == rpm_bytes
                    || String::from_utf8(deb_bytes).is_ok_and(|t| {
                        t.replace(&multiarch, "/usr/lib64/").into_bytes() == rpm_bytes
                    });
                assert!(same, "{deb_path} and the RPM's {rpm_path} differ");
            }
            mapped.push(rpm_path);
        }
        mapped.sort();
        rpm_files.retain(|f| f != "/usr/lib/systemd/system-preset/80-slurm-tenancy.preset");
        assert_eq!(mapped, rpm_files, "{deb_pkg} (.deb) and {rpm_pkg} (RPM)");
    }
}

/// The packaged tenancy-prolog-dynamic (glibc 2.28 build) still loads the node's NSS modules
/// through the node's glibc: under `passwd: compat` (nsswitch.conf bound over in a mount
/// namespace of its own) its lookup of the job's user loads libnss_compat.so.2 (LD_DEBUG), and
/// it then refuses the job (root is in no tenant) with the prolog's words.
#[test]
fn packaged_dynamic_build_loads_nss_modules() {
    if !requires_root("a mount namespace for nsswitch.conf") {
        return;
    }
    let Some(()) = portable_build() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let debs = package_files(false, "0.1.0-1");
    let unpacked = unpack(&debs, &tmp.path().join("files"));
    let (_, dir) = unpacked.iter().find(|(n, _)| n == "slurm-tenancy").unwrap();
    let dynamic = dir.join("usr/sbin/tenancy-prolog-dynamic");
    let module = Path::new("/lib")
        .join(format!("{}-linux-gnu", std::env::consts::ARCH))
        .join("libnss_compat.so.2");
    if !module.is_file() {
        panic!("{} missing (glibc's libc6 ships it)", module.display());
    }
    let nsswitch = tmp.path().join("nsswitch.conf");
    std::fs::write(&nsswitch, "passwd: compat\ngroup: compat\n").unwrap();
    let config = tmp.path().join("tenancy.toml");
    std::fs::write(
        &config,
        format!(
            "[cluster]\nname = \"nss\"\nstate_dir = \"{d}/jobs\"\naudit_log = \"{d}/audit.jsonl\"\n\
             scratch_root = \"{d}/scratch\"\n[tiers.internal]\n[tenants.nsstest]\n\
             tier = \"internal\"\ngroups = [\"nsstest-nobody\"]\n",
            d = tmp.path().display()
        ),
    )
    .unwrap();
    let out = Command::new("/usr/bin/unshare")
        .args(["--mount", "--propagation", "private", "/bin/sh", "-c"])
        .arg("/bin/mount --bind \"$1\" /etc/nsswitch.conf && exec \"$2\"")
        .arg("sh")
        .arg(&nsswitch)
        .arg(&dynamic)
        .env_clear()
        .env("LD_DEBUG", "libs")
        .env("TENANCY_CONFIG", &config)
        .env("SLURM_JOB_ID", "4747")
        .env("SLURM_JOB_UID", "0")
        .env("SLURM_JOB_GID", "0")
        .env("SLURM_JOB_USER", "root")
        .env("SLURMD_NODENAME", "n1")
        .env("SLURM_CLUSTER_NAME", "nss")
        .env("SPANK_TENANCY_TENANT", "nsstest")
        .output()
        .unwrap();
    let said = output_text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains(&format!("calling init: {}", module.display())),
        "no NSS module loaded: {said}"
    );
    assert!(
        said.contains("user root is not a member of tenant 'nsstest'"),
        "{said}"
    );
}

/// The host's short name, as slurmd names a node whose NodeName is its host name.
fn short_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .split('.')
        .next()
        .unwrap()
        .to_string()
}
