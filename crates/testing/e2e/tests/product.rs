//! The whole product on a real local Slurm cluster (plugin, tenancy-prolog/-epilog, NVML
//! stand-in): what jobs get, what a job of another tenant cannot do to them while both run (also
//! from an ssh session, through a real sshd with pam_slurm_adopt), what is left after they end,
//! and a prolog failure. Needs root; skips loudly otherwise.
//!
//! Attacks whose layer this build does not configure (device allowlist, firewall) print
//! `SKIP (layer not configured)` and are checked as soon as the layer is in the job's journal.
//!
//! Every scenario runs on the Slurm release TENANCY_TEST_SLURM_RELEASE names (the host's when
//! unset): `TENANCY_TEST_SLURM_RELEASE=24.11 cargo test -p tenancy-e2e --test product` is this
//! suite on 24.11. `e2e_on_slurm_24_11` and `e2e_on_slurm_26_05` run the two-tenant scenario on
//! those releases whatever the switch says.

use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tenancy_e2e::sshd::{SessionHook, Sshd};
use tenancy_e2e::{
    artifact, probe_kv, scenario, submitted_id, text, wait_output, Env, Options, Stack, TestUser,
};

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Every cgroup a layer asked the task to join shows up in the task's /proc/self/cgroup
/// (joined before exec, and not moved out again by Slurm's own plugins).
fn assert_joined(stack: &Stack, job: u64, probe_out: &str) {
    let journal = stack.journal(job).unwrap().expect("journal while running");
    let lines: Vec<&str> = probe_out
        .lines()
        .filter_map(|l| l.strip_prefix("cgroup="))
        .collect();
    for step in journal["steps"].as_array().unwrap() {
        let Some(paths) = step["made"].get("join_cgroups").and_then(Value::as_array) else {
            continue;
        };
        for p in paths.iter().filter_map(Value::as_str) {
            let rel = p
                .strip_prefix("/sys/fs/cgroup/")
                .unwrap_or_else(|| panic!("join_cgroups path {p} is not under /sys/fs/cgroup"));
            let (ctrl, path) = rel.split_once('/').unwrap_or((rel, ""));
            let want = format!("/{path}");
            let ok = lines.iter().any(|l| {
                let mut f = l.splitn(3, ':');
                let (_, ctrls, cg) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
                let ctrl_ok = if ctrl == "unified" {
                    ctrls.is_empty()
                } else {
                    ctrls.split(',').any(|c| c == ctrl)
                };
                ctrl_ok && (cg == want || cg.starts_with(&format!("{want}/")))
            });
            assert!(
                ok,
                "job {job}: layer {} asked tasks to join {p}, but the task is in {lines:?}",
                step["layer"]
            );
        }
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

/// An ssh session pam_slurm_adopt put into globex's job `g` (simulated: a process of globex1
/// moved into the job's extern step cgroups, as pam_slurm_adopt does), then `tenancyctl adopt`
/// as pam_exec runs it: the session joins the job's isolation and cannot open acme's device
/// `target`; the same for another user is refused.
fn adopted_session_is_isolated(e: &Env, g: u64, target: &str) {
    let s = &e.stack;
    // The test cluster runs with PrologFlags=Contain: every job has an extern step.
    let step_dirs = s.cluster.extern_step_dirs(g).unwrap();
    assert!(!step_dirs.is_empty(), "job {g}: no extern step cgroup");
    let release = s.cluster.path("jobs/release-adopted");
    let probe = e.probe();
    let session = |user: &TestUser| -> Child {
        s.cluster
            .session_in(user, &step_dirs, &release, &probe, &["open", target])
            .unwrap()
    };
    let adopt = |pid: u32, user: &TestUser| -> Output {
        let mut c = s.tenancyctl();
        c.args(["adopt", "--pid", &pid.to_string(), "--user", &user.name])
            .env("PAM_TYPE", "open_session")
            .env("SLURM_JOB_ID", g.to_string());
        s.cluster.run(c).unwrap()
    };
    // acme1 has no business in globex's job: refused (PAM would end the session).
    let mut intruder = session(&e.t.acme1);
    let o = adopt(intruder.id(), &e.t.acme1);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("refusing the session"),
        "{}",
        text(&o.stderr)
    );
    intruder.kill().unwrap();
    intruder.wait().unwrap();
    // globex1's own session joins the job's cgroups, and the device allowlist binds it.
    let owner = session(&e.t.globex1);
    let o = adopt(owner.id(), &e.t.globex1);
    assert!(
        o.status.success(),
        "adopt: {}{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    let joined: String = fs::read_to_string(format!("/proc/{}/cgroup", owner.id()))
        .unwrap()
        .lines()
        .map(|l| format!("cgroup={l}\n"))
        .collect();
    eprintln!("job {g}: adopted session {}:\n{joined}", owner.id());
    assert_joined(s, g, &joined);
    fs::write(&release, "").unwrap();
    let out = owner.wait_with_output().unwrap();
    let r = probe_kv(&text(&out.stdout));
    assert_eq!(
        r["open"], "EPERM",
        "adopted session opened acme's device {target}"
    );
    let ev = s.audit_events(g).unwrap();
    for want in ["session_refused", "session_adopted"] {
        assert!(
            ev.contains(&want.to_string()),
            "job {g}: audit events {ev:?}"
        );
    }
}

/// ssh through a real sshd, with pam_slurm_adopt and then, as the README says, either
/// `tenancyctl adopt` (pam_exec) or pam_tenancy.so in the session phase: globex1's session
/// lands in its job `g`'s isolation and cannot open acme's `device` or reach acme's listener at
/// `port_target`; with the module it also gets the job's environment (`job_env`, what the job's
/// tasks got). A user with no job on the node is refused.
fn ssh_sessions_are_isolated(
    e: &Env,
    g: u64,
    job_env: &BTreeMap<String, String>,
    device: Option<&str>,
    port_target: Option<&str>,
) {
    let s = &e.stack;
    if let Some(root) = s.cluster.slurm_root() {
        // The release roots hold Slurm, not sshd and pam_slurm_adopt: sessions are checked on
        // the host's Slurm (docs/releases.md).
        eprintln!(
            "NOT CHECKED on Slurm {}: ssh sessions (no sshd in the release root)",
            root.version()
        );
        return;
    }
    let config = s.config.display().to_string();
    let hooks = [
        SessionHook::Exec(vec![
            s.bin("tenancyctl").display().to_string(),
            "--config".into(),
            config.clone(),
            "adopt".into(),
        ]),
        SessionHook::Module(
            artifact("libpam_tenancy.so").unwrap(),
            vec![format!("config={config}")],
        ),
    ];
    let probe = e.probe();
    let mut command = format!("{probe} env");
    if let Some(d) = device {
        command += &format!("; {probe} open {d}");
    }
    if let Some(t) = port_target {
        command += &format!("; {probe} connect {t} 2000");
    }
    for (round, hook) in hooks.iter().enumerate() {
        let users = [&e.t.globex1, &e.t.outsider];
        let Some(sshd) = Sshd::start(&s.cluster, hook, &users).unwrap() else {
            return;
        };
        let adopted_before = count_events(s, g, "session_adopted");
        let o = sshd.ssh(&s.cluster, &e.t.globex1, &command).unwrap();
        let out = text(&o.stdout);
        assert!(
            o.status.success(),
            "ssh as {} (round {round}): exit {:?}, {}{}\n{}",
            e.t.globex1.name,
            o.status.code(),
            out,
            text(&o.stderr),
            sshd.log()
        );
        eprintln!("job {g}: ssh session (round {round}):\n{out}");
        assert_joined(s, g, &out);
        let r = probe_kv(&out);
        assert_eq!(r["uid"], e.t.globex1.uid.to_string(), "{out}");
        if device.is_some() {
            assert_eq!(
                r["open"], "EPERM",
                "ssh session opened acme's device: {out}"
            );
        }
        if port_target.is_some() {
            assert!(
                !r["connect"].starts_with("ok"),
                "ssh session reached acme's port: {out}"
            );
        }
        assert_eq!(
            count_events(s, g, "session_adopted"),
            adopted_before + 1,
            "job {g}: no session_adopted record for the ssh session"
        );
        if matches!(hook, SessionHook::Module(..)) {
            for k in [
                "TENANCY_TENANT",
                "CUDA_VISIBLE_DEVICES",
                "NVIDIA_VISIBLE_DEVICES",
                "TMPDIR",
            ] {
                assert_eq!(r[k], job_env[k], "ssh session's {k}: {out}");
            }
            assert_eq!(r["tmpdir_writable"], "yes", "{out}");
        }
        // No job on this node: pam_slurm_adopt refuses the login before any session exists.
        let o = sshd
            .ssh(&s.cluster, &e.t.outsider, "echo logged-in")
            .unwrap();
        assert!(
            !o.status.success() && !text(&o.stdout).contains("logged-in"),
            "{} logged in without a job: {}{}",
            e.t.outsider.name,
            text(&o.stdout),
            text(&o.stderr)
        );
    }
    // The module fails closed: a session in a job whose isolation it cannot set up (here: its
    // config cannot be read) does not start.
    let broken = SessionHook::Module(
        artifact("libpam_tenancy.so").unwrap(),
        vec!["config=/nonexistent/tenancy.toml".into()],
    );
    let Some(sshd) = Sshd::start(&s.cluster, &broken, &[&e.t.globex1]).unwrap() else {
        return;
    };
    let o = sshd
        .ssh(&s.cluster, &e.t.globex1, &format!("{probe} env"))
        .unwrap();
    assert!(
        !o.status.success() && !text(&o.stdout).contains("uid="),
        "a session started although pam_tenancy.so could not read its config: {}{}",
        text(&o.stdout),
        text(&o.stderr)
    );
}

fn count_events(s: &Stack, job: u64, event: &str) -> usize {
    s.audit_events(job)
        .unwrap()
        .iter()
        .filter(|e| *e == event)
        .count()
}

fn skip(what: &str, layer: &str) {
    eprintln!("SKIP (layer not configured: {layer} not in the job's journal): {what}");
}

scenario!(
    two_tenants_side_by_side_isolated_and_cleaned_up,
    Options::default(),
    |e: &mut Env| two_tenants_side_by_side(e, Checks::PRODUCT)
);

// The two-tenant scenario on Slurm 24.11 and 26.05 (a root each, made by scripts/slurm-root,
// with the plugins built against its headers), whatever the release switch says: that release
// runs (its sbatch, its slurmctld), it refuses at submission, and every layer is there.
scenario!(
    e2e_on_slurm_24_11,
    Options::release("24.11"),
    |e: &mut Env| { on_release(e, "24.11") }
);

scenario!(
    e2e_on_slurm_26_05,
    Options::release("26.05"),
    |e: &mut Env| { on_release(e, "26.05") }
);

/// What the two-tenant scenario checks besides what each job gets and what the other tenant
/// cannot do.
struct Checks {
    /// ssh sessions into the job (adopted by `tenancyctl adopt` and by pam_tenancy.so).
    sessions: bool,
    /// The devices and network layers must be in the job's journal (else their attacks skip).
    every_layer: bool,
}

impl Checks {
    const PRODUCT: Checks = Checks {
        sessions: true,
        every_layer: false,
    };
}

/// On release `release`: the cluster runs that release; a tenant the user is not a member of
/// is refused by the SPANK plugin in that release's sbatch, a job of nobody's on a tenant's
/// account by job_submit in its slurmctld; then the two tenants side by side, every layer
/// there.
fn on_release(e: &Env, release: &str) {
    let (s, t) = (&e.stack, &e.t);
    let root = s.cluster.slurm_root().expect("a release root");
    let mut v = s.cluster.cmd("sinfo");
    v.arg("--version");
    let version = text(&s.cluster.run(v).unwrap().stdout).trim().to_string();
    assert!(
        root.version().starts_with(&format!("{release}.")),
        "root of {release} holds Slurm {}",
        root.version()
    );
    assert!(
        version.ends_with(&format!(" {}", root.version())),
        "Slurm {release}: the cluster runs {version}"
    );
    let refused = |user: &TestUser, args: &[&str], want: &str| {
        let job = e.job(
            user,
            "refused",
            include_str!("../scripts/jobs/nothing.sh"),
            &[],
        );
        let mut all = args.to_vec();
        let (out, script) = (
            job.out.display().to_string(),
            job.script.display().to_string(),
        );
        all.extend(["-o", &out, &script]);
        let o = e.sbatch_raw(user, &all);
        assert!(
            !o.status.success() && text(&o.stderr).contains(want),
            "Slurm {release}: {} {args:?}: {}",
            user.name,
            text(&o.stderr)
        );
    };
    refused(
        &t.acme1,
        &["--tenant=globex"],
        "not a member of tenant 'globex'",
    );
    refused(&t.outsider, &["--account=globex"], "tenancy: ");
    two_tenants_side_by_side(
        e,
        Checks {
            sessions: false,
            every_layer: true,
        },
    );
    eprintln!(
        "Slurm {release} ({}): two tenants isolated (scratch, devices, network), audit verified",
        root.version()
    );
}

/// Two tenants' jobs side by side: what each gets (tenant, MIG slice, private scratch, the
/// layers' cgroups), what the other's job cannot do to it (read or write its scratch, open its
/// MIG device nodes, reach its port), with `checks`' sessions; everything gone at the end, the
/// audit records verified.
fn two_tenants_side_by_side(e: &Env, checks: Checks) {
    let s = &e.stack;
    let probe = e.probe();
    let release = s.cluster.path("jobs/release-side-by-side");
    let port = std::net::TcpListener::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();

    // acme's job: reports what it got, leaves a secret in its scratch, listens on a port.
    let (port_arg, release_arg) = (port.to_string(), release.display().to_string());
    let a_job = e.job(
        &e.t.acme1,
        "a",
        include_str!("../scripts/jobs/acme-secret.sh"),
        &[&probe, &port_arg, &release_arg],
    );
    let g_job = e.probe_job(&e.t.globex1, "g", &[&format!("envwait {release_arg}")]);
    let a_sub = now();
    let a = e.sbatch(&e.t.acme1, &["--tenant=acme", "--mig=1g.18gb"], &a_job);
    let g_sub = now();
    let g = e.sbatch(&e.t.globex1, &["--tenant=globex", "--mig=3g.71gb"], &g_job);
    let a_text = wait_output(&a_job.out, "listening=", Duration::from_secs(60));
    let g_text = wait_output(&g_job.out, "uid=", Duration::from_secs(60));
    let (ak, gk) = (probe_kv(&a_text), probe_kv(&g_text));
    for (id, k, sub) in [(a, &ak, a_sub), (g, &gk, g_sub)] {
        let started: f64 = k["started_at"].parse().unwrap();
        eprintln!(
            "job {id}: submit to user code {:.0} ms",
            (started - sub) * 1000.0
        );
    }

    // What each job got: its tenant, a MIG slice the stand-in really holds, its scratch.
    for (id, k, user, tenant) in [
        (a, &ak, &e.t.acme1, "acme"),
        (g, &gk, &e.t.globex1, "globex"),
    ] {
        assert_eq!(k["TENANCY_TENANT"], tenant, "job {id}: {k:?}");
        let uuid = &k["CUDA_VISIBLE_DEVICES"];
        assert!(uuid.starts_with("MIG-"), "job {id}: {k:?}");
        assert_eq!(&k["NVIDIA_VISIBLE_DEVICES"], uuid);
        assert!(
            slice_row(s, uuid).is_some(),
            "job {id}: {uuid} not in the stand-in's state: {:?}",
            s.shim_instances().unwrap()
        );
        let tmp = &k["TMPDIR"];
        assert_eq!(
            Path::new(tmp),
            s.paths.scratch_root.join(tenant).join(format!("job_{id}")),
            "job {id}"
        );
        assert_eq!(k["TENANCY_SCRATCH"], *tmp);
        assert_eq!(k["uid"], user.uid.to_string());
        assert_eq!(
            k["tmpdir_owner"],
            user.uid.to_string(),
            "job {id}: TMPDIR owner"
        );
        assert_eq!(k["tmpdir_writable"], "yes", "job {id}");
        assert!(s.journal(id).unwrap().is_some(), "job {id}: no journal");
    }
    assert_ne!(ak["CUDA_VISIBLE_DEVICES"], gk["CUDA_VISIBLE_DEVICES"]);
    for l in a_text.lines().filter(|l| l.starts_with("cgroup=")) {
        eprintln!("job {a} batch task: {l}");
    }
    assert_joined(s, a, &a_text);
    assert_joined(s, g, &g_text);

    // srun steps inside the jobs go through the same task entry.
    let step_tenant = e.step_says(&e.t.globex1, g, &["env"], "TENANCY_TENANT");
    assert_eq!(step_tenant, "globex");
    let o = e.step(&e.t.globex1, g, &["env"]);
    let sk = probe_kv(&text(&o.stdout));
    assert_eq!(sk["CUDA_VISIBLE_DEVICES"], gk["CUDA_VISIBLE_DEVICES"]);
    assert_joined(s, g, &text(&o.stdout));

    // Scratch: acme's own step reads its secret (control); globex's job cannot.
    let secret = format!("{}/secret", ak["TMPDIR"]);
    assert_eq!(
        e.step_says(&e.t.acme1, a, &["read", &secret], "read"),
        "ok acme-secret"
    );
    let attack = e.step_says(&e.t.globex1, g, &["read", &secret], "read");
    assert_eq!(attack, "EACCES", "globex read acme's scratch: {attack}");
    let listing = e.step_says(
        &e.t.globex1,
        g,
        &["write", &format!("{}/planted", ak["TMPDIR"]), "x"],
        "write",
    );
    assert_eq!(listing, "EACCES", "globex wrote into acme's scratch");

    // acme's device node that globex's job must not open (when the devices layer is on).
    let mut device_target = None;

    // Devices: globex's job cannot open acme's MIG device nodes (EPERM from the device
    // allowlist, not from file modes: the same node opened outside any job gives ENXIO, as a
    // node without a driver does).
    if s.made(g, "devices").unwrap().is_some() {
        let (a_gpu, a_minors) = slice_row(s, &ak["CUDA_VISIBLE_DEVICES"]).unwrap();
        let (g_gpu, g_minors) = slice_row(s, &gk["CUDA_VISIBLE_DEVICES"]).unwrap();
        let caps = s.paths.dev_dir.join("nvidia-caps");
        let mut targets: Vec<PathBuf> = a_minors
            .iter()
            .map(|m| caps.join(format!("nvidia-cap{m}")))
            .collect();
        if a_gpu != g_gpu {
            targets.push(s.paths.dev_dir.join(format!("nvidia{a_gpu}")));
        }
        for t in &targets {
            let t = t.display().to_string();
            let outside = Command::new(&probe).args(["open", &t]).output().unwrap();
            let outside = probe_kv(&text(&outside.stdout));
            assert_ne!(outside["open"], "EPERM", "control: {t}");
            assert_ne!(outside["open"], "ENOENT", "control: {t}");
            let r = e.step_says(&e.t.globex1, g, &["open", &t], "open");
            assert_eq!(r, "EPERM", "globex opened acme's device {t}: {r}");
        }
        // Its own slice's nodes pass the allowlist (ENXIO: no driver behind them).
        for m in g_minors {
            let t = caps.join(format!("nvidia-cap{m}")).display().to_string();
            let r = e.step_says(&e.t.globex1, g, &["open", &t], "open");
            assert_ne!(r, "EPERM", "globex denied its own device {t}");
        }
        if checks.sessions {
            adopted_session_is_isolated(e, g, &targets[0].display().to_string());
        }
        device_target = Some(targets[0].display().to_string());
    } else {
        assert!(!checks.every_layer, "no devices layer in globex's journal");
        skip("globex cannot open acme's device nodes", "devices");
    }

    // Network: acme's listener answers a process outside any job (control) and acme's own
    // job, but not globex's job.
    let target = format!("127.0.0.1:{port}");
    let ctl = Command::new(&probe)
        .args(["connect", &target, "2000"])
        .output()
        .unwrap();
    assert!(
        probe_kv(&text(&ctl.stdout))["connect"].starts_with("ok"),
        "control connect: {}",
        text(&ctl.stdout)
    );
    if s.made(g, "network").unwrap().is_some() {
        assert!(
            s.firewall,
            "network layer in the journal but no firewall loaded"
        );
        let own = e.step_says(&e.t.acme1, a, &["connect", &target, "2000"], "connect");
        assert!(own.starts_with("ok"), "acme's own job: {own}");
        let r = e.step_says(&e.t.globex1, g, &["connect", &target, "2000"], "connect");
        assert!(
            !r.starts_with("ok"),
            "globex's job reached acme's port {port}: {r}"
        );
        eprintln!("globex -> acme:{port}: {r}");
    } else {
        assert!(!checks.every_layer, "no network layer in globex's journal");
        skip("globex cannot reach acme's listening port", "network");
    }
    let net_target = s.made(g, "network").unwrap().map(|_| target.clone());
    if checks.sessions {
        ssh_sessions_are_isolated(e, g, &gk, device_target.as_deref(), net_target.as_deref());
    }

    // End both jobs; everything they had is gone (globex's tier keeps its scratch aside).
    e.end_jobs(&release, &[a, g], Duration::from_secs(60));
    wait_for(Duration::from_secs(30), "epilogs finish", || {
        s.journal(a).unwrap().is_none() && s.journal(g).unwrap().is_none()
    });
    assert_eq!(
        s.shim_instances().unwrap(),
        Vec::<Value>::new(),
        "MIG instances left"
    );
    assert!(!Path::new(&ak["TMPDIR"]).exists(), "acme scratch not wiped");
    assert!(
        !Path::new(&gk["TMPDIR"]).exists(),
        "globex scratch not moved"
    );
    let retained = s.paths.scratch_root.join("globex/.retained");
    let kept: Vec<String> = fs::read_dir(&retained)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        kept.iter().any(|n| n.starts_with(&format!("job_{g}."))),
        "no job_{g}.* in {}: {kept:?}",
        retained.display()
    );
    assert!(
        !s.paths.scratch_root.join("acme/.retained").exists()
            || fs::read_dir(s.paths.scratch_root.join("acme/.retained"))
                .unwrap()
                .next()
                .is_none(),
        "acme's tier wipes, yet something was retained"
    );
    for id in [a, g] {
        let ev = s.audit_events(id).unwrap();
        assert!(
            ev.contains(&"job_start".to_string()) && ev.contains(&"job_end".to_string()),
            "job {id}: audit events {ev:?}"
        );
    }
    // The epilogs anchored the heads with the MAC of the config's key, which verify takes.
    let v = e.ctl(&[
        "audit",
        "verify",
        "--anchor",
        s.paths.audit_anchors.to_str().unwrap(),
        s.paths.audit_log.to_str().unwrap(),
    ]);
    assert!(
        v.status.success() && !text(&v.stdout).contains("anchor none"),
        "audit verify: {}{}",
        text(&v.stdout),
        text(&v.stderr)
    );
    assert!(
        !text(&v.stdout).contains("without a valid MAC"),
        "{}",
        text(&v.stdout)
    );
}

fn wait_for(timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < timeout, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Spawns an interactive client (srun/salloc) whose task holds until `release` exists.
fn spawn_held(e: &Env, user: &TestUser, client: &str, args: &[&str]) -> Child {
    let mut c = e.stack.cluster.cmd_as(user, client);
    c.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c.spawn().unwrap()
}

/// While the job of an interactive client runs: its slice is in the stand-in and its journal
/// on disk; after release: both gone. Returns the task's report.
fn held_job_checks(e: &Env, child: Child, release: &Path, tenant: &str) {
    let s = &e.stack;
    let t = Instant::now();
    let job = loop {
        let mut q = s.cluster.cmd("squeue");
        q.args(["-h", "-t", "R", "-o", "%i"]);
        let out = text(&s.cluster.run(q).unwrap().stdout);
        if let Some(id) = out
            .split_whitespace()
            .next()
            .and_then(|w| w.parse::<u64>().ok())
        {
            if s.made(id, "scratch").unwrap().is_some() {
                break id;
            }
        }
        assert!(t.elapsed() < Duration::from_secs(60), "no running job");
        std::thread::sleep(Duration::from_millis(100));
    };
    wait_for(Duration::from_secs(30), "the slice appears", || {
        !s.shim_instances().unwrap().is_empty()
    });
    let uuid = s.made(job, "mig").unwrap().expect("mig made")["mig_uuid"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(slice_row(s, &uuid).is_some());
    fs::write(release, "").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}: {}", tenant, text(&out.stderr));
    let k = probe_kv(&text(&out.stdout));
    assert_eq!(k["TENANCY_TENANT"], tenant, "{k:?}");
    assert_eq!(k["CUDA_VISIBLE_DEVICES"], uuid);
    assert_eq!(
        Path::new(&k["TMPDIR"]),
        s.paths.scratch_root.join(tenant).join(format!("job_{job}"))
    );
    assert_eq!(k["tmpdir_writable"], "yes");
    assert_eq!(k["tmpdir_owner"], k["uid"]);
    s.cluster
        .wait_job_done(job, Duration::from_secs(30))
        .unwrap();
    wait_for(Duration::from_secs(30), "epilog cleans up", || {
        s.journal(job).unwrap().is_none() && s.shim_instances().unwrap().is_empty()
    });
    let ev = s.audit_events(job).unwrap();
    assert!(ev.contains(&"job_start".to_string()) && ev.contains(&"job_end".to_string()));
}

scenario!(
    srun_and_salloc_jobs_get_their_slice_and_scratch,
    Options::default(),
    |e: &mut Env| {
        let probe = e.probe();

        let release = e.stack.cluster.path("jobs/release-srun");
        let child = spawn_held(
            e,
            &e.t.acme1,
            "srun",
            &[
                "--tenant=acme",
                "--mig=2g.35gb",
                "-n1",
                &probe,
                "envwait",
                release.to_str().unwrap(),
            ],
        );
        held_job_checks(e, child, &release, "acme");

        // salloc runs its command on the submit host; the srun inside is a step of the
        // allocation and gets the allocation's isolation.
        let release = e.stack.cluster.path("jobs/release-salloc");
        let child = spawn_held(
            e,
            &e.t.globex1,
            "salloc",
            &[
                "--tenant=globex",
                "--mig=3g.71gb",
                "srun",
                "-n1",
                &probe,
                "envwait",
                release.to_str().unwrap(),
            ],
        );
        held_job_checks(e, child, &release, "globex");
    }
);

scenario!(
    prolog_failure_rolls_back_requeues_holds_and_drains,
    Options::default(),
    |e: &mut Env| {
        let s = &e.stack;
        let o = s.shim_ctl(&["arm", "ci-create", "UNKNOWN"]).unwrap();
        assert!(o.status.success(), "arm: {}", text(&o.stderr));

        let job = e.probe_job(&e.t.acme1, "fail", &["env"]);
        let out = job.out.clone();
        let id = e.sbatch(&e.t.acme1, &["--tenant=acme", "--mig=1g.18gb"], &job);
        let info = s
            .cluster
            .wait_job(id, &["PENDING"], Duration::from_secs(60))
            .and_then(|_| {
                let t = Instant::now();
                loop {
                    let i = s.cluster.job_info(id)?;
                    // The job passes through COMPLETING (its epilog runs) before it is PENDING
                    // again, already with the held reason: wait for both.
                    let held = i["Reason"].contains("held") && i["JobState"] == "PENDING";
                    if held || t.elapsed() > Duration::from_secs(60) {
                        return Ok(i);
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
            .unwrap();
        assert_eq!(info["JobState"], "PENDING", "{info:?}");
        assert_eq!(info["Reason"], "launch_failed_requeued_held", "{info:?}");
        assert!(!out.exists() || !fs::read_to_string(&out).unwrap().contains("uid="));

        // The node is drained, and says by whom and why.
        let state = s
            .cluster
            .wait_node_state(&["drain"], Duration::from_secs(30))
            .unwrap();
        assert_eq!(state, "drain");
        let reason = s.cluster.node_reason().unwrap();
        eprintln!("drain reason: {reason}");
        assert!(
            reason.starts_with("tenancy:") && reason.contains(&format!("job {id}")),
            "the drain reason should name the product and the job, got {reason:?}"
        );

        // Nothing left behind: no instance (the GI made before the CI failed is gone too), no
        // journal, no scratch; the rollback is audited and the chain verifies.
        assert_eq!(s.shim_instances().unwrap(), Vec::<Value>::new());
        assert!(s.journal(id).unwrap().is_none(), "journal left");
        assert!(
            !s.paths
                .scratch_root
                .join("acme")
                .join(format!("job_{id}"))
                .exists(),
            "scratch left"
        );
        let ev = s.audit_events(id).unwrap();
        assert!(ev.contains(&"rollback".to_string()), "audit events {ev:?}");
        assert!(
            !ev.contains(&"job_start".to_string()),
            "audit events {ev:?}"
        );
        let v = e.ctl(&["audit", "verify", s.paths.audit_log.to_str().unwrap()]);
        assert!(v.status.success(), "{}{}", text(&v.stdout), text(&v.stderr));

        // The admin resumes the node and releases the job: it now runs with its slice.
        let o = s.shim_ctl(&["disarm"]).unwrap();
        assert!(o.status.success());
        let mut c = s.cluster.cmd("scontrol");
        c.args([
            "update",
            &format!("nodename={}", s.cluster.node),
            "state=resume",
        ]);
        assert!(s.cluster.run(c).unwrap().status.success());
        let mut c = s.cluster.cmd("scontrol");
        c.args(["release", &id.to_string()]);
        assert!(s.cluster.run(c).unwrap().status.success());
        // Slurm delays a requeued job's eligibility (about 2 min); the admin can start it now.
        let mut c = s.cluster.cmd("scontrol");
        c.args(["update", &format!("jobid={id}"), "starttime=now"]);
        assert!(s.cluster.run(c).unwrap().status.success());
        let info = s
            .cluster
            .wait_job_done(id, Duration::from_secs(120))
            .unwrap();
        assert_eq!(info["JobState"], "COMPLETED", "{info:?}");
        let k = probe_kv(&fs::read_to_string(&out).unwrap());
        assert!(k["CUDA_VISIBLE_DEVICES"].starts_with("MIG-"), "{k:?}");
        assert_eq!(s.cluster.node_state().unwrap(), "idle");
        let md = fs::metadata(s.paths.scratch_root.join("acme")).unwrap();
        assert_eq!(md.uid(), 0);
    }
);

// A user who leaves the submit-side check out (their own slurm.conf naming their own
// plugstack, with a plugin that sets `SPANK_TENANCY_TENANT` unchecked) is refused by
// slurmctld's `job_submit/tenancy` with the same reason the prolog would give: no job exists,
// and the node is not drained, which the prolog's refusal on the node would do.
scenario!(
    a_job_that_bypasses_the_submit_check_is_refused_by_slurmctld_and_drains_no_node,
    Options::default(),
    |e: &mut Env| {
        let s = &e.stack;
        let user = &e.t.acme1;
        let own_conf = s.cluster.own_plugstack(user).unwrap();
        let submit = |name: &str, tenant: &str, mig: &str| {
            let job = e.probe_job(user, name, &["env"]);
            let mut c = s.cluster.cmd_as(user, "sbatch");
            c.env("SLURM_CONF", &own_conf)
                .env("OWN_TENANT", tenant)
                .env("OWN_MIG", mig)
                .arg("-o")
                .arg(&job.out)
                .arg(&job.script)
                .args(&job.args);
            (s.cluster.run(c).unwrap(), job.out)
        };

        // The user's plugin works: what it sets reaches the node (a MIG slice of the profile it
        // named, for a tenant the user is a member of).
        let (o, out) = submit("own", "acme", "1g.18gb");
        assert!(o.status.success(), "sbatch: {}", text(&o.stderr));
        let id = submitted_id(&o).unwrap();
        s.cluster
            .wait_job_done(id, Duration::from_secs(90))
            .unwrap();
        let k = probe_kv(&fs::read_to_string(&out).unwrap());
        assert_eq!(k["TENANCY_TENANT"], "acme", "{k:?}");
        assert!(k["CUDA_VISIBLE_DEVICES"].starts_with("MIG-"), "{k:?}");

        // Another tenant's name, and a profile the user's tier does not allow: refused by slurmctld,
        // with the prolog's reason, and no job is made.
        for (name, tenant, mig, reason) in [
            (
                "steal",
                "globex",
                "",
                &*format!(
                    "tenancy: user {} is not a member of tenant 'globex'",
                    user.name
                ),
            ),
            ("big", "acme", "7g.141gb", "7g.141gb"),
        ] {
            let (o, _) = submit(name, tenant, mig);
            let err = text(&o.stderr);
            assert!(
                !o.status.success(),
                "sbatch {name} was accepted: {}",
                text(&o.stdout)
            );
            assert!(err.contains(reason), "sbatch {name}: {err}");
        }
        let mut q = s.cluster.cmd("squeue");
        q.args(["-h", "-a", "-o", "%A"]);
        let queued = text(&s.cluster.run(q).unwrap().stdout);
        assert_eq!(queued.trim(), "", "jobs were made: {queued}");
        assert_eq!(s.cluster.node_state().unwrap(), "idle");
        assert_eq!(s.cluster.node_reason().unwrap(), "");
    }
);

/// /tmp and /dev/shm are the node's, shared by every job on it, unless Slurm's
/// job_container/tmpfs gives each job its own (docs/admin-guide.md, "Per-job /tmp and /dev/shm";
/// `tenancyctl doctor` warns without it): a file acme's job leaves there with the usual umask
/// would be readable by globex's job. With the plugin it is acme's job's alone: globex's job
/// and the node itself do not see it. (Without the plugin, globex reads it: the test fails.)
#[test]
fn tmp_and_dev_shm_are_per_job_with_slurms_job_container_tmpfs() {
    if let Ok(release) = std::env::var(tenancy_e2e::RELEASE_ENV) {
        // Slurm's job_container/tmpfs keeps each job's mount namespace in a file bind-mounted
        // in BasePath, which a chroot'ed slurmstepd cannot make on the host's mounts: checked on
        // the host's Slurm only (docs/releases.md).
        eprintln!(
            "NOT CHECKED on Slurm {release}: job_container/tmpfs (needs a node, not a chroot)"
        );
        return;
    }
    // Not under /tmp, which each job gets its own of: the plugin's BasePath (it refuses /tmp),
    // and the stack (the job scripts, outputs, config and scratch folders).
    let var_tmp = Path::new("/var/tmp");
    let base =
        ContainerBase(var_tmp.join(format!("tenancy-e2e-containers-{}", std::process::id())));
    let options = Options::default()
        .slurm_conf("JobContainerType=job_container/tmpfs")
        .file(
            "job_container.conf",
            format!("AutoBasePath=true\nBasePath={}\n", base.0.display()),
        )
        .folder_in(var_tmp);
    scenario(
        "tmp_and_dev_shm_are_per_job_with_slurms_job_container_tmpfs",
        options,
        |e: &mut Env| tmp_and_dev_shm_are_the_jobs(e),
    );
}

fn tmp_and_dev_shm_are_the_jobs(e: &Env) {
    let leak = format!("tenancy-e2e-leak-{}", std::process::id());
    let (tmp, shm) = (format!("/tmp/{leak}"), format!("/dev/shm/{leak}"));
    // Where the files land on the node when the containers fail.
    let _leaks = Leaks(vec![PathBuf::from(&tmp), PathBuf::from(&shm)]);
    let held = e.hold_two(
        "tmp",
        &[
            &format!("write {tmp} acme-tmp"),
            &format!("write {shm} acme-shm"),
        ],
    );
    let (a, g, a_text) = (held.a, held.g, &held.a_text);
    assert_eq!(
        a_text.lines().filter(|l| *l == "write=ok").count(),
        2,
        "{a_text}"
    );
    for (path, secret) in [(&tmp, "acme-tmp"), (&shm, "acme-shm")] {
        // acme's job sees its file, from another step too ...
        assert_eq!(
            e.step_says(&e.t.acme1, a, &["read", path], "read"),
            format!("ok {secret}")
        );
        // ... globex's job does not, nor does the node.
        assert_eq!(
            e.step_says(&e.t.globex1, g, &["read", path], "read"),
            "ENOENT",
            "globex's job reads acme's {path}"
        );
        assert!(!Path::new(path).exists(), "{path} on the node itself");
    }
    e.release(&held);
}

// SysV IPC belongs to a namespace, and each job has its own (the SPANK plugin puts its tasks
// in it, `tenancy_job::task::join_job_ipc`): a shared memory segment acme's job makes with
// mode 0666 is there for its other steps, not for globex's job nor for the node. (Without the
// job's namespace, globex finds it: the test fails.)
scenario!(
    a_jobs_sysv_shared_memory_is_its_own,
    Options::default(),
    |e: &mut Env| {
        // A key no other test or program uses.
        let key = (0x7e_0000 + std::process::id() % 0xffff).to_string();
        let _on_node = NodeSegment(key.parse().unwrap());
        let held = e.hold_two("shm", &[&format!("shm {key} create")]);
        let (a, g, a_text) = (held.a, held.g, &held.a_text);
        let made = probe_kv(a_text)["shm"].clone();
        assert!(made.starts_with("ok "), "{a_text}");
        // Another step of acme's job finds the same segment ...
        assert_eq!(e.step_says(&e.t.acme1, a, &["shm", &key], "shm"), made);
        // ... globex's job and the node do not.
        assert_eq!(
            e.step_says(&e.t.globex1, g, &["shm", &key], "shm"),
            "ENOENT",
            "globex's job finds acme's segment"
        );
        // SAFETY: plain syscall, in the node's namespace.
        let on_node = unsafe { libc::shmget(key.parse().unwrap(), 0, 0) };
        assert_eq!(on_node, -1, "acme's segment is in the node's namespace");
        e.release(&held);
    }
);

/// A SysV segment of the node's namespace, removed when the test ends (it is there only when
/// a job's segment was not kept in the job's namespace).
struct NodeSegment(libc::key_t);

impl Drop for NodeSegment {
    fn drop(&mut self) {
        // SAFETY: plain syscalls on a segment no process is attached to.
        unsafe {
            let id = libc::shmget(self.0, 0, 0);
            if id >= 0 {
                libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut());
            }
        }
    }
}

/// Files removed when the test ends, passed or failed.
struct Leaks(Vec<PathBuf>);

impl Drop for Leaks {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = fs::remove_file(p);
        }
    }
}

/// job_container/tmpfs's BasePath, removed after the cluster (slurmd mounts it on itself).
struct ContainerBase(PathBuf);

impl Drop for ContainerBase {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).output();
        let _ = fs::remove_dir_all(&self.0);
    }
}

// ---- containment: every process Slurm starts for a job stays inside its isolation ----------

/// An acme job with a MIG slice that listens on a port, beside a globex job, both running:
/// what a process of globex's job must not reach. Returns the jobs (acme's, globex's), acme's
/// MIG cap node, acme's listener address and the file that ends both jobs.
struct Victim {
    a: u64,
    g: u64,
    cap: String,
    addr: String,
    release: PathBuf,
}

fn victim_beside_attacker(e: &Env, name: &str) -> Victim {
    let s = &e.stack;
    let probe = e.probe();
    let release = s.cluster.path(&format!("jobs/release-{name}"));
    let port = std::net::TcpListener::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let a_job = e.probe_job(
        &e.t.acme1,
        &format!("{name}-a"),
        &["env", &format!("serve {port} {}", release.display())],
    );
    let g_job = e.probe_job(
        &e.t.globex1,
        &format!("{name}-g"),
        &[&format!("envwait {}", release.display())],
    );
    let a = e.sbatch(&e.t.acme1, &["--tenant=acme", "--mig=1g.18gb"], &a_job);
    let g = e.sbatch(&e.t.globex1, &["--tenant=globex"], &g_job);
    let a_text = wait_output(&a_job.out, "listening=", Duration::from_secs(60));
    wait_output(&g_job.out, "uid=", Duration::from_secs(60));
    assert!(
        s.made(g, "devices").unwrap().is_some() && s.made(g, "network").unwrap().is_some(),
        "globex's job has no device allowlist or firewall: nothing to contain"
    );
    let (_, minors) = slice_row(s, &probe_kv(&a_text)["CUDA_VISIBLE_DEVICES"]).unwrap();
    let cap = s
        .paths
        .dev_dir
        .join(format!("nvidia-caps/nvidia-cap{}", minors[0]))
        .display()
        .to_string();
    let addr = format!("127.0.0.1:{port}");
    // Controls: outside any job the cap node passes (no driver: ENXIO) and the port answers.
    let outside = |args: &[&str], key: &str| {
        let o = Command::new(&probe).args(args).output().unwrap();
        probe_kv(&text(&o.stdout))[key].clone()
    };
    assert_eq!(outside(&["open", &cap], "open"), "ENXIO", "control: {cap}");
    assert!(
        outside(&["connect", &addr, "2000"], "connect").starts_with("ok"),
        "control: {addr}"
    );
    Victim {
        a,
        g,
        cap,
        addr,
        release,
    }
}

/// A folder with the attack a user of globex's job gets Slurm to run (scripts/attack.sh), and
/// beside it the probe and what to try: acme's cap node and listener. Returns the script.
fn attack_in(dir: &Path, e: &Env) -> PathBuf {
    let script = dir.join("attack.sh");
    fs::write(&script, include_str!("../scripts/attack.sh")).unwrap();
    fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    fs::copy(e.probe(), dir.join("probe")).unwrap();
    script
}

/// Points the attack in `dir` at the victim (its `cap` and `addr` files): until then it does
/// nothing.
fn aim(dir: &Path, v: &Victim) {
    fs::write(dir.join("addr"), &v.addr).unwrap();
    fs::write(dir.join("cap"), &v.cap).unwrap();
}

/// The report of the attack in `dir` from a process of job `job` (once written).
fn attack_report(dir: &Path, job: u64) -> PathBuf {
    let prefix = format!("out-{job}-");
    let mut report = None;
    wait_for(Duration::from_secs(60), "the attack's report", || {
        report = fs::read_dir(dir)
            .unwrap()
            .filter_map(|f| f.ok())
            .find(|f| {
                let name = f.file_name().to_string_lossy().into_owned();
                name.starts_with(&prefix) && !name.ends_with(".tmp")
            })
            .map(|f| f.path());
        report.is_some()
    });
    report.unwrap()
}

/// The attack in `out` was held: acme's device denied (EPERM), its port unreachable, and the
/// process was in every cgroup of globex's job.
fn assert_attack_held(e: &Env, v: &Victim, out: &Path, what: &str) {
    let report = wait_output(out, "done=", Duration::from_secs(60));
    let k = probe_kv(&report);
    assert_eq!(
        k["open"], "EPERM",
        "{what} of globex's job opened acme's MIG cap node {}: {report}",
        v.cap
    );
    assert!(
        !k["connect"].starts_with("ok"),
        "{what} of globex's job reached acme's port {}: {report}",
        v.addr
    );
    assert_joined(&e.stack, v.g, &report);
}

/// A folder of `user`'s for scripts Slurm runs as the user.
fn user_folder(e: &Env, user: &TestUser, name: &str) -> PathBuf {
    let dir = e.stack.cluster.user_dir(user).join(name);
    fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(user.uid), Some(user.gid)).unwrap();
    dir
}

/// `srun --jobid=G --overlap` as globex's user with extra options.
fn overlap_step(e: &Env, job: u64, opts: &[&str], cmd: &[&str]) -> Output {
    let mut c = e.stack.cluster.cmd_as(&e.t.globex1, "srun");
    c.arg(format!("--jobid={job}"))
        .args(["--overlap", "-n1", "-N1"])
        .args(opts)
        .args(cmd);
    e.stack.cluster.run(c).unwrap()
}

fn end(e: &Env, v: &Victim) {
    e.end_jobs(&v.release, &[v.a, v.g], Duration::from_secs(60));
}

/// A step of globex's job whose `srun OPTION=script` runs the attack.
fn attack_from_srun_option(e: &Env, option: &str) {
    let v = victim_beside_attacker(e, option);
    let dir = user_folder(e, &e.t.globex1, option);
    let script = attack_in(&dir, e);
    aim(&dir, &v);
    let o = overlap_step(
        e,
        v.g,
        &[&format!("--{option}={}", script.display())],
        &["/bin/true"],
    );
    assert!(o.status.success(), "step: {}", text(&o.stderr));
    let out = attack_report(&dir, v.g);
    assert_attack_held(e, &v, &out, &format!("srun --{option}"));
    end(e, &v);
}

scenario!(
    task_epilog_stays_in_the_jobs_isolation,
    Options::default(),
    |e: &mut Env| attack_from_srun_option(e, "task-epilog")
);

scenario!(
    task_prolog_stays_in_the_jobs_isolation,
    Options::default(),
    |e: &mut Env| attack_from_srun_option(e, "task-prolog")
);

#[test]
fn slurm_conf_task_epilog_stays_in_the_jobs_isolation() {
    // The admin's TaskEpilog runs for every task of every job, as the job's user; it reads
    // what to try from files the test writes once the jobs run, and reports per job.
    let dir = tempfile::Builder::new()
        .prefix("tenancy-e2e-taskepilog-")
        .tempdir()
        .unwrap();
    fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .unwrap();
    let script = dir.path().join("attack.sh");
    fs::write(&script, include_str!("../scripts/attack.sh")).unwrap();
    fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let options = Options::default().slurm_conf(format!("TaskEpilog={}", script.display()));
    scenario(
        "slurm_conf_task_epilog_stays_in_the_jobs_isolation",
        options,
        |e: &mut Env| {
            attack_in(dir.path(), e);
            let v = victim_beside_attacker(e, "conf-task-epilog");
            aim(dir.path(), &v);
            let o = overlap_step(e, v.g, &[], &["/bin/true"]);
            assert!(o.status.success(), "step: {}", text(&o.stderr));
            let report = attack_report(dir.path(), v.g);
            assert_attack_held(e, &v, &report, "slurm.conf TaskEpilog");
            end(e, &v);
        },
    );
}

scenario!(
    interactive_step_stays_in_the_jobs_isolation,
    Options::default(),
    |e: &mut Env| {
        let v = victim_beside_attacker(e, "interactive");
        // `srun --pty` needs a terminal: script(1) gives it one, as a user's ssh session would.
        let dir = user_folder(e, &e.t.globex1, "interactive");
        let shell = attack_in(&dir, e);
        aim(&dir, &v);
        let srun = format!(
            "srun --jobid={} --overlap -n1 -N1 --pty {}",
            v.g,
            shell.display()
        );
        let mut c = e.stack.cluster.cmd_as(&e.t.globex1, "script");
        c.args(["-qec", &srun, "/dev/null"]).stdin(Stdio::null());
        let o = e.stack.cluster.run(c).unwrap();
        assert!(
            o.status.success(),
            "srun --pty: {}{}",
            text(&o.stdout),
            text(&o.stderr)
        );
        let out = attack_report(&dir, v.g);
        assert_attack_held(e, &v, &out, "an interactive step (srun --pty)");
        end(e, &v);
    }
);

/// Globex's drop counter, from `tenancyctl firewall show --format json`.
fn globex_drops(e: &Env) -> u64 {
    let o = e.ctl(&["firewall", "show", "--format", "json"]);
    assert!(o.status.success(), "firewall show: {}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    v["tenants"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["tenant"] == "globex"))
        .and_then(|t| t["drop_packets"].as_u64())
        .unwrap_or_else(|| panic!("no globex drop counter: {v}"))
}

// `tenancyctl firewall apply` while jobs run (docs/admin-guide.md: after every config change) replaces the
// table. On this hybrid node the rules match each tenant's cgroup folder, which apply keeps
// and every task of a job is in; nothing in the table is per job. Globex's next step is still
// dropped at acme's port (and counted for globex), acme's own step still reaches it, and the
// jobs complete.
scenario!(
    firewall_apply_keeps_running_jobs_isolated,
    Options::default(),
    |e: &mut Env| {
        let v = victim_beside_attacker(e, "fwapply");
        let attack = |when: &str| {
            let before = globex_drops(e);
            let got = e.step_says(&e.t.globex1, v.g, &["connect", &v.addr, "2000"], "connect");
            assert!(
                !got.starts_with("ok"),
                "{when}: globex's step reached acme's port {}: {got}",
                v.addr
            );
            assert!(
                globex_drops(e) > before,
                "{when}: globex's attempt was not dropped by the firewall ({got})"
            );
        };
        attack("before firewall apply");
        let o = e.ctl(&["firewall", "apply"]);
        assert!(
            o.status.success(),
            "firewall apply: {}{}",
            text(&o.stdout),
            text(&o.stderr)
        );
        attack("after firewall apply");
        let own = e.step_says(&e.t.acme1, v.a, &["connect", &v.addr, "2000"], "connect");
        assert!(own.starts_with("ok"), "acme's own step after apply: {own}");
        end(e, &v);
    }
);

/// Pids of processes whose command line holds `marker`.
fn pids_with(marker: &str) -> Vec<i32> {
    fs::read_dir("/proc")
        .unwrap()
        .filter_map(|d| d.ok())
        .filter_map(|d| d.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.windows(marker.len()).any(|w| w == marker.as_bytes()))
        })
        .collect()
}

scenario!(
    nothing_a_job_started_outlives_it,
    Options::default(),
    |e: &mut Env| {
        let s = &e.stack;
        let probe = e.probe();
        let id = std::process::id();
        // Never created: each detached process waits on its own marker path for ten minutes.
        let marker = |what: &str| format!("/nonexistent/tenancy-outlive-{id}-{what}");
        let release = s.cluster.path("jobs/release-outlive");
        let detach = include_str!("../scripts/detach.sh");
        let (batch, release_arg) = (marker("batch"), release.display().to_string());
        let job = e.job(
            &e.t.globex1,
            "outlive",
            detach,
            &[&probe, &batch, &release_arg],
        );
        let g = e.sbatch(&e.t.globex1, &["--tenant=globex"], &job);
        wait_output(&job.out, "uid=", Duration::from_secs(60));
        // Slurm runs a task prolog and epilog without arguments: theirs in files beside them.
        let dir = user_folder(e, &e.t.globex1, "outlive");
        let script = |what: &str| {
            let path = dir.join(format!("{what}.sh"));
            fs::write(&path, detach).unwrap();
            fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
            fs::write(
                dir.join(format!("{what}.sh.args")),
                format!("{probe} {}", marker(what)),
            )
            .unwrap();
            path
        };
        let (epilog, prolog) = (script("task-epilog"), script("task-prolog"));
        let o = overlap_step(
            e,
            g,
            &[
                &format!("--task-epilog={}", epilog.display()),
                &format!("--task-prolog={}", prolog.display()),
            ],
            &["/bin/true"],
        );
        assert!(o.status.success(), "step: {}", text(&o.stderr));
        // The task prolog's process is in the step's Slurm cgroups and ends with the step; the
        // batch script's and the task epilog's live on until the job ends.
        let all = ["batch", "task-epilog", "task-prolog"];
        wait_for(
            Duration::from_secs(30),
            "the detached processes run",
            || {
                ["batch", "task-epilog"]
                    .iter()
                    .all(|w| !pids_with(&marker(w)).is_empty())
            },
        );
        fs::write(&release, "").unwrap();
        let info = s.cluster.wait_job_done(g, Duration::from_secs(60)).unwrap();
        assert_eq!(info["JobState"], "COMPLETED", "job {g}: {info:?}");
        wait_for(Duration::from_secs(30), "the epilog finishes", || {
            s.journal(g).unwrap().is_none()
        });
        let left: Vec<(&str, Vec<i32>)> = all
            .iter()
            .map(|w| (*w, pids_with(&marker(w))))
            .filter(|(_, p)| !p.is_empty())
            .collect();
        for (_, pids) in &left {
            for p in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*p),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        assert!(
            left.is_empty(),
            "processes of job {g} outlived it: {left:?}"
        );
        let ev = s.audit_events(g).unwrap();
        assert!(ev.contains(&"job_end".to_string()), "{ev:?}");
    }
);

scenario!(
    get_user_env_is_refused_at_submit,
    Options::default(),
    |e: &mut Env| {
        let s = &e.stack;
        let job = e.job(
            &e.t.acme1,
            "get-user-env",
            include_str!("../scripts/jobs/nothing.sh"),
            &[],
        );
        let mut c = s.cluster.cmd_as(&e.t.acme1, "sbatch");
        c.args(["--tenant=acme", "--get-user-env", "-o"])
            .arg(&job.out)
            .arg(&job.script);
        let o = s.cluster.run(c).unwrap();
        let err = text(&o.stderr);
        assert!(!o.status.success(), "sbatch --get-user-env was accepted");
        assert!(
            err.contains("tenancy:") && err.contains("--get-user-env") && err.contains("internal"),
            "the refusal names the option and the tier: {err}"
        );
        // No job was made, so no node ran a prolog for it or drained.
        let mut q = s.cluster.cmd("squeue");
        q.args(["-h", "-o", "%i"]);
        assert_eq!(text(&s.cluster.run(q).unwrap().stdout).trim(), "");
        assert_eq!(s.cluster.node_state().unwrap(), "idle");
        // The same job without the option runs.
        let id = e.sbatch(&e.t.acme1, &["--tenant=acme"], &job);
        let info = s
            .cluster
            .wait_job_done(id, Duration::from_secs(60))
            .unwrap();
        assert_eq!(info["JobState"], "COMPLETED", "{info:?}");
    }
);

scenario!(
    get_user_env_allowed_by_the_tier_is_warned_by_doctor,
    Options::default(),
    |e: &mut Env| {
        let s = &e.stack;
        let doctor = |e: &Env| {
            let o = e.ctl(&[
                "doctor",
                "--format",
                "json",
                "--slurm-conf",
                s.cluster.conf.to_str().unwrap(),
            ]);
            let rows: Vec<Value> = serde_json::from_slice(&o.stdout)
                .unwrap_or_else(|_| panic!("doctor json: {}{}", text(&o.stdout), text(&o.stderr)));
            rows.into_iter()
                .filter(|r| r["check"] == "containment.get_user_env")
                .collect::<Vec<Value>>()
        };
        let before = doctor(e);
        assert!(
            before.len() == 1 && before[0]["severity"] == "ok",
            "{before:?}"
        );
        // The admin lets tier internal (acme's) load login environments.
        let text_before = fs::read_to_string(&s.config).unwrap();
        let allowing = text_before.replacen(
            "[tiers.internal]\n",
            "[tiers.internal]\nallow_get_user_env = true\n",
            1,
        );
        assert_ne!(allowing, text_before);
        fs::write(&s.config, allowing).unwrap();
        let after = doctor(e);
        assert!(
            after.iter().any(|r| r["severity"] == "warn"
                && r["message"].as_str().unwrap().contains("tier 'internal'")),
            "doctor does not warn about tier internal: {after:?}"
        );
        assert!(
            !after
                .iter()
                .any(|r| r["message"].as_str().unwrap().contains("'regulated'")),
            "{after:?}"
        );
        // And slurmctld now takes such a job of acme's, still not globex's.
        let job = e.job(
            &e.t.acme1,
            "get-user-env-ok",
            include_str!("../scripts/jobs/nothing.sh"),
            &[],
        );
        let id = e.sbatch(&e.t.acme1, &["--tenant=acme", "--get-user-env"], &job);
        // slurmd gives `su -` up to 120 s before it goes on with the submitted environment.
        let info = s
            .cluster
            .wait_job_done(id, Duration::from_secs(180))
            .unwrap();
        assert_eq!(info["JobState"], "COMPLETED", "{info:?}");
        let job = e.job(
            &e.t.globex1,
            "get-user-env-no",
            include_str!("../scripts/jobs/nothing.sh"),
            &[],
        );
        let mut c = s.cluster.cmd_as(&e.t.globex1, "sbatch");
        c.args(["--tenant=globex", "--get-user-env", "-o"])
            .arg(&job.out)
            .arg(&job.script);
        let o = s.cluster.run(c).unwrap();
        assert!(!o.status.success(), "globex's tier does not allow it");
    }
);

scenario!(
    export_none_refusal_names_export,
    Options::default(),
    |e: &mut Env| {
        let s = &e.stack;
        let job = e.job(
            &e.t.acme1,
            "export",
            include_str!("../scripts/jobs/nothing.sh"),
            &[],
        );
        // sbatch itself asks for the login environment with every --export but exactly ALL
        // (SLURM_GET_USER_ENV=1).
        for export in [
            "--export=NONE",
            "--export=TENANCY_E2E_VAR=1",
            "--export=ALL,TENANCY_E2E_VAR=1",
        ] {
            let mut c = s.cluster.cmd_as(&e.t.acme1, "sbatch");
            c.args(["--tenant=acme", export, "-o"])
                .arg(&job.out)
                .arg(&job.script);
            let o = s.cluster.run(c).unwrap();
            let err = text(&o.stderr);
            assert!(!o.status.success(), "sbatch {export} was accepted");
            assert!(
                err.contains("tenancy:")
                    && err.contains("--export=NONE")
                    && err.contains("--export=ALL"),
                "sbatch {export}: the refusal names --export and what to use instead: {err}"
            );
        }
        assert_eq!(s.cluster.node_state().unwrap(), "idle");
        // What the refusal suggests runs, with the variable set where it is submitted.
        let job = e.job(
            &e.t.acme1,
            "export-all",
            include_str!("../scripts/jobs/print-var.sh"),
            &[],
        );
        let mut c = s.cluster.cmd_as(&e.t.acme1, "sbatch");
        c.env("TENANCY_E2E_VAR", "exported")
            .args(["--tenant=acme", "--export=ALL", "-o"])
            .arg(&job.out)
            .arg(&job.script);
        let o = s.cluster.run(c).unwrap();
        assert!(
            o.status.success(),
            "sbatch --export=ALL: {}",
            text(&o.stderr)
        );
        let id = submitted_id(&o).unwrap();
        let info = s
            .cluster
            .wait_job_done(id, Duration::from_secs(60))
            .unwrap();
        assert_eq!(info["JobState"], "COMPLETED", "{info:?}");
        assert_eq!(fs::read_to_string(&job.out).unwrap().trim(), "var=exported");
    }
);

scenario!(
    encrypted_tier_job_uses_its_tmpdir,
    Options::default(),
    |e: &mut Env| {
        let mut scratch_fs =
            tenancy_e2e::scratch_fs::EncryptedScratch::mount_over(&e.stack.paths.scratch_root, 256)
                .expect("an ext4 -O encrypt loop mount over the scratch root");
        if let Some(r) = e.stack.cluster.slurm_root() {
            scratch_fs
                .also_in_root(&r.dir)
                .expect("the mount in the release root");
        }
        tenancy_e2e::scratch_fs::require_encryption(&e.stack.config, "regulated").unwrap();
        let mut folders = Vec::new();
        for (user, tenant) in [(&e.t.globex1, "globex"), (&e.t.acme1, "acme")] {
            let job = e.job(
                user,
                &format!("encrypted-tmpdir-{tenant}"),
                include_str!("../scripts/jobs/encrypted-tmpdir.sh"),
                &[],
            );
            let id = e.completes(
                user,
                &[&format!("--tenant={tenant}")],
                &job,
                Duration::from_secs(120),
            );
            let o = fs::read_to_string(&job.out).unwrap();
            let folder = e
                .stack
                .paths
                .scratch_root
                .join(tenant)
                .join(format!("job_{id}"));
            for want in [
                format!("tmpdir={}", folder.display()),
                "mktemp=inside".into(),
                "read=hello".into(),
                "cmp=ok".into(),
                "links=ok".into(),
                "done=ok".into(),
            ] {
                assert!(o.lines().any(|l| l == want), "{tenant}: no {want:?} in {o}");
            }
            // mktemp's folder name varies: the listing has big, link and it.
            assert!(o.contains("files=big,link,tmp."), "{tenant}: {o}");
            folders.push((tenant, id, folder));
        }
        // The job_start records say which folder is encrypted, and with which key.
        let recs = e.stack.audit_records().unwrap();
        let key_of = |job: u64| -> Option<String> {
            recs.iter()
                .find(|r| r["job_id"] == job && r["event"] == "job_start")
                .and_then(|r| {
                    r["resources"]
                        .as_array()?
                        .iter()
                        .find(|x| x["layer"] == "scratch")?
                        .get("detail")?
                        .get("encrypted")?
                        .get("key_id")?
                        .as_str()
                        .map(String::from)
                })
        };
        let (_, gid, _) = &folders[0];
        let key = key_of(*gid).expect("globex's job_start names its scratch key");
        assert_eq!(key_of(folders[1].1), None, "acme's tier does not encrypt");
        // globex's folder is retained, locked: names in ciphertext, no file opens for root.
        let retained =
            tenancy_scratch::find_retained(&e.stack.paths.scratch_root, *gid, None).unwrap();
        assert_eq!(retained.len(), 1, "{retained:?}");
        assert_eq!(retained[0].key_id.map(|k| k.to_string()), Some(key));
        let mut locked = 0;
        for ent in fs::read_dir(&retained[0].path).unwrap().flatten() {
            let n = ent.file_name().to_string_lossy().into_owned();
            assert!(
                !["big", "link"].contains(&n.as_str()),
                "a name in clear: {n}"
            );
            if ent.file_type().unwrap().is_file() {
                let err = fs::read(ent.path()).unwrap_err();
                assert_eq!(err.raw_os_error(), Some(libc::ENOKEY), "{err}");
                locked += 1;
            }
        }
        assert!(
            locked >= 1,
            "no locked file in {}",
            retained[0].path.display()
        );
        e.stack.stop().unwrap();
        scratch_fs.remove();
    }
);
