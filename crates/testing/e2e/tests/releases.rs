//! The product on the Slurm releases sites run: 24.11 (Debian trixie) and 26.05 (Debian sid),
//! each in a root made by scripts/slurm-root (cached in /var/cache/slurm-tenancy/roots) with the
//! plugins built against that root's headers, its slurmctld and slurmd run with chroot
//! (cgroup/v1 on this hybrid host). A root that cannot be made (archive unreachable) fails the
//! test: a release is never skipped silently. Needs root; skips loudly otherwise.

use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tenancy_e2e::stack::{tenancy_toml, Stack, StackPaths, Tenants};
use tenancy_e2e::{
    artifact, probe_kv, require_root, submitted_id, Cluster, ClusterOptions, SlurmRoot, TestUser,
    Users,
};

/// Users are created by name: the tests of this binary run one after the other.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn root_of(release: &str) -> SlurmRoot {
    let t = Instant::now();
    let r = SlurmRoot::make(release).unwrap_or_else(|e| panic!("Slurm {release}: {e:#}"));
    eprintln!(
        "Slurm {} root {} ready in {:.1} s",
        r.version(),
        r.dir.display(),
        t.elapsed().as_secs_f64()
    );
    assert!(
        r.version().starts_with(&format!("{release}.")),
        "root of {release} holds Slurm {}",
        r.version()
    );
    r
}

/// `sinfo --version` of the cluster: the release that runs, not the host's.
fn running_version(c: &Cluster) -> String {
    let mut v = c.cmd("sinfo");
    v.arg("--version");
    text(&c.run(v).unwrap().stdout).trim().to_string()
}

fn sbatch(c: &Cluster, user: &TestUser, args: &[&str], body: &str) -> Output {
    let dir = c.user_dir(user);
    let script = dir.join("job.sh");
    fs::write(&script, format!("#!/bin/sh\n{body}\n")).unwrap();
    let mut s = c.cmd_as(user, "sbatch");
    s.args(args)
        .arg("-o")
        .arg(dir.join("job-%j.out"))
        .arg(&script);
    c.run(s).unwrap()
}

/// slurmctld of each release, in its root, loads job_submit_tenancy.so built against that
/// release's headers (slurmctld loads a job_submit plugin only when its version equals its own,
/// micro release included) and refuses at submission a job the plugin must refuse, with the
/// plugin's reason; a job of a tenant's member is accepted.
#[test]
fn job_submit_plugin_loads_on_each_release() {
    if !require_root("job_submit_plugin_loads_on_each_release") {
        return;
    }
    let _g = serial();
    let mut users = Users::new();
    let t = Tenants::create(&mut users).expect("users");
    // "22.05": this machine's own Slurm and the workspace's build of the plugin.
    for release in ["22.05", "24.11", "26.05"] {
        let slurm = (release != "22.05").then(|| root_of(release));
        let folder = tempfile::tempdir().unwrap();
        let paths = StackPaths::under(folder.path());
        let plugin = match &slurm {
            Some(s) => s.plugin("libjob_submit_tenancy.so").unwrap(),
            None => artifact("libjob_submit_tenancy.so").unwrap(),
        };
        let c = Cluster::start(ClusterOptions {
            job_submit_plugin: Some(plugin),
            tenancy_toml: Some(tenancy_toml(&paths, &t)),
            slurm_root: slurm.clone(),
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("cluster of Slurm {release}: {e:#}"));
        let version = running_version(&c);
        assert!(
            version.contains(&format!(" {release}.")),
            "Slurm {release}: the cluster runs {version}"
        );
        if let Some(s) = &slurm {
            assert!(version.ends_with(&format!(" {}", s.version())), "{version}");
        }

        let refused = sbatch(&c, &t.outsider, &["--account=acme"], "true");
        let err = text(&refused.stderr);
        assert!(
            !refused.status.success() && err.contains("tenancy: "),
            "Slurm {release}: a job of {} (in no tenant) on acme's account was not refused \
             by job_submit/tenancy: {err}",
            t.outsider.name
        );
        let ok = sbatch(&c, &t.acme1, &["--account=acme"], "true");
        assert!(
            ok.status.success(),
            "Slurm {release}: acme's member refused: {}",
            text(&ok.stderr)
        );
        let log = fs::read_to_string(c.path("log/slurmctld.log")).unwrap_or_default();
        assert!(
            log.contains("job_submit/tenancy: refused a job"),
            "Slurm {release}: slurmctld's log has no refusal of the plugin's: {log}"
        );
        eprintln!("Slurm {release} ({version}): job_submit/tenancy loaded, refused: {err}");
    }
}

#[test]
fn e2e_on_slurm_24_11() {
    if !require_root("e2e_on_slurm_24_11") {
        return;
    }
    let _g = serial();
    two_tenants_on("24.11");
}

#[test]
fn e2e_on_slurm_26_05() {
    if !require_root("e2e_on_slurm_26_05") {
        return;
    }
    let _g = serial();
    two_tenants_on("26.05");
}

/// Waits until `path` holds a line starting with `prefix`; returns the whole file.
fn wait_output(path: &Path, prefix: &str, timeout: Duration) -> String {
    let t = Instant::now();
    loop {
        let s = fs::read_to_string(path).unwrap_or_default();
        if s.lines().any(|l| l.starts_with(prefix)) {
            return s;
        }
        assert!(
            t.elapsed() < timeout,
            "no {prefix:?} in {} after {timeout:?}: {s:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The MIG slice `uuid` as the stand-in lists it: (gpu index, cap minors).
fn slice_row(stack: &Stack, uuid: &str) -> Option<(u32, Vec<u32>)> {
    stack.shim_instances().unwrap().iter().find_map(|r| {
        (r["mig_uuid"].as_str() == Some(uuid)).then(|| {
            let gpu = r["gpu"].as_str().unwrap().parse().unwrap();
            let minors = r["cap_minors"]
                .as_str()
                .unwrap()
                .split(',')
                .map(|m| m.parse().unwrap())
                .collect();
            (gpu, minors)
        })
    })
}

/// The product's two-tenant checks on `release`: refusal at submission (SPANK in sbatch and
/// job_submit in slurmctld, both of that release), each job's tenant, MIG slice and private
/// scratch, another tenant's job unable to read that scratch, open its MIG device nodes or
/// reach its port, everything gone at the end, and the audit records verified.
fn two_tenants_on(release: &str) {
    let slurm = root_of(release);
    let mut users = Users::new();
    let t = Tenants::create(&mut users).expect("users");
    let folder = tempfile::Builder::new()
        .prefix("tenancy-e2e-stack-")
        .tempdir()
        .unwrap();
    let s = Stack::start_in(folder.path(), &t, slurm.clone())
        .unwrap_or_else(|e| panic!("stack on Slurm {release}: {e:#}"));
    let c = &s.cluster;
    let version = running_version(c);
    assert!(
        version.ends_with(&format!(" {}", slurm.version())),
        "Slurm {release}: the cluster runs {version}"
    );
    let probe = s.bin("tenancy-e2e-probe").display().to_string();
    let step = |user: &TestUser, job: u64, args: &[&str], key: &str| -> String {
        let mut cmd = c.cmd_as(user, "srun");
        cmd.arg(format!("--jobid={job}"))
            .args(["--overlap", "-n1", "-N1"])
            .arg(&probe)
            .args(args);
        let o = c.run(cmd).unwrap();
        probe_kv(&text(&o.stdout))
            .get(key)
            .cloned()
            .unwrap_or_else(|| {
                panic!(
                    "Slurm {release}: step of job {job} ({args:?}) printed no {key}: {} {}",
                    text(&o.stdout),
                    text(&o.stderr)
                )
            })
    };

    // Refused at submission: a tenant the user is not a member of (SPANK, in sbatch), and a
    // job of nobody's on a tenant's account (job_submit, in slurmctld).
    let o = sbatch(c, &t.acme1, &["--tenant=globex"], "true");
    assert!(
        !o.status.success() && text(&o.stderr).contains("not a member of tenant 'globex'"),
        "Slurm {release}: acme1 --tenant=globex: {}",
        text(&o.stderr)
    );
    let o = sbatch(c, &t.outsider, &["--account=globex"], "true");
    assert!(
        !o.status.success() && text(&o.stderr).contains("tenancy: "),
        "Slurm {release}: outsider on globex's account: {}",
        text(&o.stderr)
    );

    let release_file = c.path("jobs/release");
    let port = std::net::TcpListener::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let a_out = c.user_dir(&t.acme1).join("a.out");
    let g_out = c.user_dir(&t.globex1).join("g.out");
    let run = |user: &TestUser, args: &[&str], out: &PathBuf, body: String| -> u64 {
        let script = c.user_dir(user).join("held.sh");
        fs::write(&script, format!("#!/bin/sh\n{body}")).unwrap();
        let mut cmd = c.cmd_as(user, "sbatch");
        cmd.args(args).arg("-o").arg(out).arg(&script);
        let o = c.run(cmd).unwrap();
        assert!(
            o.status.success(),
            "Slurm {release}: sbatch {args:?}: {}",
            text(&o.stderr)
        );
        submitted_id(&o).unwrap()
    };
    let a = run(
        &t.acme1,
        &["--tenant=acme", "--mig=1g.18gb"],
        &a_out,
        format!(
            "{probe} env\n{probe} write \"$TMPDIR/secret\" acme-secret\n{probe} serve {port} {}\n",
            release_file.display()
        ),
    );
    let g = run(
        &t.globex1,
        &["--tenant=globex", "--mig=3g.71gb"],
        &g_out,
        format!("{probe} envwait {}\n", release_file.display()),
    );
    let ak = probe_kv(&wait_output(&a_out, "listening=", Duration::from_secs(90)));
    let gk = probe_kv(&wait_output(&g_out, "uid=", Duration::from_secs(90)));
    for (id, k, tenant) in [(a, &ak, "acme"), (g, &gk, "globex")] {
        assert_eq!(k["TENANCY_TENANT"], tenant, "job {id}: {k:?}");
        assert!(
            k["CUDA_VISIBLE_DEVICES"].starts_with("MIG-"),
            "job {id}: {k:?}"
        );
        assert_eq!(
            Path::new(&k["TMPDIR"]),
            s.paths.scratch_root.join(tenant).join(format!("job_{id}"))
        );
        assert!(s.journal(id).unwrap().is_some(), "job {id}: no journal");
    }
    assert_ne!(ak["CUDA_VISIBLE_DEVICES"], gk["CUDA_VISIBLE_DEVICES"]);

    // Scratch: acme's own step reads its secret (control); globex's job cannot.
    let secret = format!("{}/secret", ak["TMPDIR"]);
    assert_eq!(
        step(&t.acme1, a, &["read", &secret], "read"),
        "ok acme-secret"
    );
    let r = step(&t.globex1, g, &["read", &secret], "read");
    assert_eq!(
        r, "EACCES",
        "Slurm {release}: globex read acme's scratch: {r}"
    );

    // Devices: globex's job cannot open acme's MIG device nodes; its own pass the allowlist.
    assert!(
        s.made(g, "devices").unwrap().is_some(),
        "Slurm {release}: no devices layer in globex's journal"
    );
    let (a_gpu, a_minors) = slice_row(&s, &ak["CUDA_VISIBLE_DEVICES"]).unwrap();
    let (g_gpu, g_minors) = slice_row(&s, &gk["CUDA_VISIBLE_DEVICES"]).unwrap();
    let caps = s.paths.dev_dir.join("nvidia-caps");
    let mut targets: Vec<PathBuf> = a_minors
        .iter()
        .map(|m| caps.join(format!("nvidia-cap{m}")))
        .collect();
    if a_gpu != g_gpu {
        targets.push(s.paths.dev_dir.join(format!("nvidia{a_gpu}")));
    }
    for target in &targets {
        let target = target.display().to_string();
        let outside = Command::new(&probe)
            .args(["open", &target])
            .output()
            .unwrap();
        assert_ne!(
            probe_kv(&text(&outside.stdout))["open"],
            "EPERM",
            "control: {target}"
        );
        let r = step(&t.globex1, g, &["open", &target], "open");
        assert_eq!(
            r, "EPERM",
            "Slurm {release}: globex opened acme's {target}: {r}"
        );
    }
    for m in g_minors {
        let own = caps.join(format!("nvidia-cap{m}")).display().to_string();
        assert_ne!(
            step(&t.globex1, g, &["open", &own], "open"),
            "EPERM",
            "{own}"
        );
    }

    // Network: acme's listener answers acme's own job, not globex's.
    assert!(s.firewall && s.made(g, "network").unwrap().is_some());
    let target = format!("127.0.0.1:{port}");
    let own = step(&t.acme1, a, &["connect", &target, "2000"], "connect");
    assert!(
        own.starts_with("ok"),
        "Slurm {release}: acme's own job: {own}"
    );
    let r = step(&t.globex1, g, &["connect", &target, "2000"], "connect");
    assert!(
        !r.starts_with("ok"),
        "Slurm {release}: globex's job reached acme's port {port}: {r}"
    );

    // The end: both complete, their isolation is gone, the audit log verifies.
    fs::write(&release_file, "").unwrap();
    for id in [a, g] {
        let info = c.wait_job_done(id, Duration::from_secs(60)).unwrap();
        assert_eq!(info["JobState"], "COMPLETED", "job {id}: {info:?}");
    }
    let t0 = Instant::now();
    while s.journal(a).unwrap().is_some() || s.journal(g).unwrap().is_some() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "epilogs did not finish"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(s.shim_instances().unwrap(), Vec::<Value>::new());
    assert!(!Path::new(&ak["TMPDIR"]).exists(), "acme scratch not wiped");
    for id in [a, g] {
        let ev = s.audit_events(id).unwrap();
        assert!(
            ev.contains(&"job_start".to_string()) && ev.contains(&"job_end".to_string()),
            "Slurm {release}: job {id}: audit events {ev:?}"
        );
    }
    let mut v = s.tenancyctl();
    v.args(["audit", "verify", "--anchor"])
        .arg(&s.paths.audit_anchors)
        .arg(&s.paths.audit_log);
    let v = c.run(v).unwrap();
    assert!(
        v.status.success(),
        "Slurm {release}: audit verify: {}{}",
        text(&v.stdout),
        text(&v.stderr)
    );
    eprintln!(
        "Slurm {release} ({}): two tenants isolated (scratch, devices, network), audit verified",
        slurm.version()
    );
}
