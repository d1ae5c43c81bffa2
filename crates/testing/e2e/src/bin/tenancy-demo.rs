//! The demo a new user runs first (demo/run.sh builds and calls it): a local Slurm cluster with
//! slurm-tenancy installed, jobs of two tenants side by side, what each job got, what was
//! refused, attacks of one tenant's job (and of an ssh session adopted into it) on the other's
//! that fail, `tenancyctl report` and
//! `tenancyctl audit verify`, a job waiting on its tenant's quota (Slurm's `AssocGrpGRES`, the
//! limits made by `tenancyctl slurm sync`) and a node pool keeping another tenant out, then
//! everything shut down.

use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Output};
use std::time::{Duration, Instant};
use tenancy_e2e::{probe_kv, submitted_id, TestUser, Users};
use tenancy_e2e::{Limits, Options, Stack, Tenants};

fn say(s: &str) {
    println!("\n=== {s}");
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Prints a command's output indented.
fn show(o: &Output) {
    for l in text(&o.stdout).lines().chain(text(&o.stderr).lines()) {
        println!("    {l}");
    }
}

struct Demo {
    stack: Stack,
    t: Tenants,
    release: PathBuf,
}

impl Demo {
    fn probe(&self) -> String {
        self.stack.bin("tenancy-e2e-probe").display().to_string()
    }

    /// Submits the demo job as `user`; prints the command line and what sbatch said.
    fn submit(&self, user: &TestUser, args: &[&str], port: u16) -> Result<Option<u64>> {
        self.submit_with(user, &[], args, port)
    }

    /// [`Self::submit`] with variables set for sbatch (shown before the command).
    fn submit_with(
        &self,
        user: &TestUser,
        vars: &[(&str, &str)],
        args: &[&str],
        port: u16,
    ) -> Result<Option<u64>> {
        let dir = self.stack.cluster.user_dir(user);
        let script = dir.join("job.sh");
        let p = self.probe();
        fs::write(&script, include_str!("../../scripts/jobs/demo.sh"))?;
        let mut shown: Vec<String> = vars.iter().map(|(k, v)| format!("{k}={v}")).collect();
        shown.push("sbatch".into());
        shown.extend(args.iter().map(|a| a.to_string()));
        println!("{} $ {} job.sh", user.name, shown.join(" "));
        let mut c = self.stack.cluster.cmd_as(user, "sbatch");
        c.envs(vars.iter().copied())
            .args(args)
            .arg("-o")
            .arg(dir.join("slurm-%j.out"))
            .arg(&script)
            .arg(&p)
            .arg(port.to_string())
            .arg(&self.release);
        let o = self.stack.cluster.run(c)?;
        if o.status.success() {
            print!("    {}", text(&o.stdout));
            Ok(Some(submitted_id(&o)?))
        } else {
            // Slurm adds two generic lines after the plugin's own; the plugin's says why.
            let err = text(&o.stderr);
            let ours: Vec<&str> = err.lines().filter(|l| l.contains("tenancy:")).collect();
            for l in if ours.is_empty() {
                err.lines().collect()
            } else {
                ours
            } {
                println!("    {l}");
            }
            println!(
                "    (exit {}, no job created)",
                o.status.code().unwrap_or(-1)
            );
            Ok(None)
        }
    }

    fn output(&self, user: &TestUser, id: u64) -> PathBuf {
        self.stack
            .cluster
            .user_dir(user)
            .join(format!("slurm-{id}.out"))
    }

    /// Waits until the job reports what it got and listens; returns its report.
    fn report(&self, user: &TestUser, id: u64) -> Result<BTreeMap<String, String>> {
        let out = self.output(user, id);
        let t = Instant::now();
        loop {
            let s = fs::read_to_string(&out).unwrap_or_default();
            if s.lines().any(|l| l.starts_with("listening=")) {
                return Ok(probe_kv(&s));
            }
            let info = self.stack.cluster.job_info(id)?;
            let state = info.get("JobState").cloned().unwrap_or_default();
            if !matches!(state.as_str(), "PENDING" | "CONFIGURING" | "RUNNING") {
                bail!(
                    "job {id} ended ({state}, reason {}) before it started its work: {s}",
                    info.get("Reason").cloned().unwrap_or_default()
                );
            }
            if t.elapsed() > Duration::from_secs(60) {
                bail!("job {id} did not start within 60 s ({state}): {s}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs the probe in a new step of `job` as `user`, shows the command, returns the value.
    fn attack(&self, user: &TestUser, job: u64, args: &[&str], key: &str) -> Result<String> {
        println!(
            "{} $ srun --jobid={job} --overlap tenancy-e2e-probe {}",
            user.name,
            args.join(" ")
        );
        let mut c = self.stack.cluster.cmd_as(user, "srun");
        c.arg(format!("--jobid={job}"))
            .args(["--overlap", "-n1"])
            .arg(self.probe())
            .args(args);
        let o = self.stack.cluster.run(c)?;
        let v = probe_kv(&text(&o.stdout))
            .get(key)
            .cloned()
            .with_context(|| format!("no answer from the step: {}", text(&o.stderr)))?;
        Ok(v)
    }

    /// globex1 logs into the node with ssh while its job `job` runs: pam_slurm_adopt puts the
    /// session into the job's extern step (simulated: its process is moved into those
    /// cgroups), then pam_exec runs `tenancyctl adopt`. The session then tries to open `node`
    /// (acme's MIG device). Returns what the open gave, None without an extern step.
    fn adopted_session(&self, job: u64, node: &str) -> Result<Option<String>> {
        let s = &self.stack;
        let dirs = s.cluster.extern_step_dirs(job)?;
        if dirs.is_empty() {
            return Ok(None);
        }
        let user = &self.t.globex1;
        println!(
            "{} $ ssh {}   # pam_slurm_adopt: into job {job}; pam_exec: tenancyctl adopt",
            user.name, s.cluster.node
        );
        let go = s.cluster.path("jobs/release-ssh");
        let session = s
            .cluster
            .session_in(user, &dirs, &go, &self.probe(), &["open", node])?;
        let mut c = s.tenancyctl();
        c.args([
            "adopt",
            "--pid",
            &session.id().to_string(),
            "--user",
            &user.name,
        ])
        .env("PAM_TYPE", "open_session")
        .env("SLURM_JOB_ID", job.to_string());
        show(&s.cluster.run(c)?);
        println!(
            "{} (ssh session) $ tenancy-e2e-probe open {node}",
            user.name
        );
        fs::write(&go, "")?;
        let out = session.wait_with_output()?;
        Ok(probe_kv(&text(&out.stdout)).get("open").cloned())
    }
}

fn outcome(v: &str, refused: bool) -> &'static str {
    match (v, refused) {
        (v, true) if v.starts_with("ok") => "SUCCEEDED (isolation broken!)",
        (_, true) => "refused, as it must be",
        (v, false) if v.starts_with("ok") => "works",
        _ => "FAILED (unexpected)",
    }
}

fn describe(errno: &str) -> String {
    match errno {
        "EACCES" => "EACCES (Permission denied)".into(),
        "EPERM" => "EPERM (Operation not permitted)".into(),
        "ENXIO" => "ENXIO (no driver behind the stand-in's node)".into(),
        "timeout" => "timed out (dropped by the firewall)".into(),
        other => other.into(),
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(0) => ExitCode::SUCCESS,
        Ok(broken) => {
            eprintln!("tenancy-demo: {broken} isolation check(s) did not hold");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("tenancy-demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Returns the number of isolation checks that did not hold.
fn run() -> Result<u32> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "the demo starts Slurm daemons and creates users: run it as root (sudo ./demo/run.sh)"
        );
    }
    let mut users = Users::new();
    let t = Tenants::create(&mut users)?;
    let root = tempfile::Builder::new().prefix("tenancy-demo-").tempdir()?;
    say("Starting a local Slurm cluster with slurm-tenancy installed");
    // With Slurm's accounting (MariaDB + slurmdbd, the MIG profiles as typed GPU GRES), so the
    // demo can end with the cross-check of the two books.
    // DCGM exporter's job mapping: the prolog names each job in its MIG instance's file.
    let dcgm = root.path().join("dcgm-job-mapping");
    let mapping = dcgm.clone();
    // slurmctld enforces the tenants' quotas (association limits in slurmdbd).
    let options = Options::default()
        .slurm_conf("AccountingStorageEnforce=associations,limits")
        .accounting(tenancy_e2e::Accounting {
            gpu_types: vec![
                ("1g.18gb".into(), 7),
                ("2g.35gb".into(), 3),
                ("3g.71gb".into(), 2),
                ("7g.141gb".into(), 1),
            ],
        })
        .config(move |c| {
            c.cluster().dcgm_job_mapping_dir(&mapping);
            // acme's quota: one 1g.18gb slice at a time (Slurm holds the tenant's jobs to it).
            c.tenant("acme")
                .limits(Limits::default().mig_slices("1g.18gb", 1));
        });
    let stack = Stack::start(root.path(), &t, &options)?;
    println!("slurm.conf:   {}", stack.cluster.conf.display());
    println!("tenancy.toml: {}", stack.config.display());
    println!("DCGM_HPC_JOB_MAPPING_DIR: {}", dcgm.display());
    sync_tenants(&stack, &t)?;
    // The regulated tenant's scratch encrypted with a key per job (docs/encrypted-scratch.md):
    // the scratch root on an ext4 made with `mkfs.ext4 -O encrypt` on a loop device, unmounted
    // and removed at the end (after the cluster stopped: it is dropped after `demo`). Where no
    // loop device can be had (a container), the demo goes on with globex's scratch in clear.
    let scratch_fs =
        match tenancy_e2e::scratch_fs::EncryptedScratch::mount_over(&stack.paths.scratch_root, 512)
            .and_then(|fs| {
                tenancy_e2e::scratch_fs::require_encryption(&stack.config, "regulated").map(|()| fs)
            }) {
            Ok(fs) => {
                println!(
                    "scratch root: {} on ext4 (mkfs.ext4 -O encrypt, loop device of {})",
                    stack.paths.scratch_root.display(),
                    fs.image.display()
                );
                Some(fs)
            }
            Err(e) => {
                println!(
                    "scratch root: NOT ENCRYPTED for globex (no encrypt-capable ext4 here: {e})"
                );
                None
            }
        };
    // The node's own signing key, and its records forwarded to a local rsyslog over TLS.
    let collector = Collector::start(&root.path().join("collector"))?;
    let toml = fs::read_to_string(&stack.config)?
        + &format!(
            "\n[audit]\ncollectors = [\"127.0.0.1:{}\"]\nca_file = \"{}\"\n",
            collector.port,
            collector.dir.join("ca.pem").display()
        );
    fs::write(&stack.config, toml)?;
    let mut c = stack.tenancyctl();
    c.args(["audit", "keygen"]);
    let o = stack.cluster.run(c)?;
    let public_keys = root.path().join("nodes.pub");
    fs::write(&public_keys, &o.stdout)?;
    let mut c = stack.tenancyctl();
    c.args(["audit", "forward", "--confirm-ms", "500"])
        .stderr(fs::File::create(root.path().join("forward.log"))?);
    let forwarder = c.spawn().context("tenancyctl audit forward")?;
    println!(
        "audit:        signed by this node's key ({}), forwarded to rsyslog on 127.0.0.1:{} over TLS",
        text(&o.stdout).trim(),
        collector.port
    );
    let prolog = tenancy_e2e::artifact("tenancy-prolog")?;
    let libc = if std::env::var_os("TENANCY_FROM_PACKAGES").is_some() {
        "installed by the slurm-tenancy package".to_string()
    } else {
        std::fs::read_to_string(prolog.with_file_name("LIBC"))
            .map(|l| format!("linked with {}", l.trim()))
            .unwrap_or_else(|_| "cargo's build, linked with glibc".to_string())
    };
    println!("Prolog=:      {} ({libc})", prolog.display());
    println!(
        "GPUs:         two H200-141GB with MIG on (NVML stand-in {})",
        stack.paths.nvml_library.display()
    );
    println!(
        "tenants:      acme (tier internal: scratch wiped at job end), globex (tier regulated: own GPU, scratch {}retained)",
        if scratch_fs.is_some() { "encrypted with a key per job, " } else { "" }
    );
    println!(
        "firewall:     {}",
        if stack.firewall {
            "per-tenant nftables table loaded"
        } else {
            "not in this build"
        }
    );
    println!(
        "node {} is {}",
        stack.cluster.node,
        stack.cluster.node_state()?
    );
    let release = stack.cluster.path("jobs/release-demo");
    let demo = Demo { stack, t, release };
    let d = &demo;
    let s = &d.stack;
    let mut broken = 0u32;

    say("Submitting one job per tenant (they run side by side on the node)");
    let a_port = free_port()?;
    let g_port = free_port()?;
    // Each job asks Slurm for its slice as typed GPU GRES too, so Slurm accounts it.
    let a = d.submit(
        &d.t.acme1,
        &["--tenant=acme", "--mig=1g.18gb", "--gres=gpu:1g.18gb:1"],
        a_port,
    )?;
    let g = d.submit(
        &d.t.globex1,
        &["--tenant=globex", "--mig=3g.71gb", "--gres=gpu:3g.71gb:1"],
        g_port,
    )?;
    let (Some(a), Some(g)) = (a, g) else {
        bail!("an accepted submit failed; see above");
    };

    say("Refused at submit time (no job is created)");
    d.submit(&d.t.acme1, &["--tenant=globex", "--mig=1g.18gb"], 0)?;
    d.submit(&d.t.outsider, &["--mig=1g.18gb"], 0)?;
    d.submit(&d.t.acme1, &["--tenant=acme", "--mig=7g.141gb"], 0)?;
    d.submit(&d.t.both, &["--mig=1g.18gb"], 0)?;

    say("Refused by slurmctld: acme1 leaves the sbatch check out (a plugstack of their own)");
    let own = s.cluster.own_plugstack(&d.t.acme1)?;
    println!(
        "(~/slurm.conf loads ~/own_spank.so instead of the product's plugin; it hands the job any tenant, unchecked)"
    );
    let own = own.display().to_string();
    broken += u32::from(
        d.submit_with(
            &d.t.acme1,
            &[("SLURM_CONF", own.as_str()), ("OWN_TENANT", "globex")],
            &[],
            0,
        )?
        .is_some(),
    );
    println!("node {} is {}", s.cluster.node, s.cluster.node_state()?);

    say("What each job got (as the job itself sees it)");
    let ak = d.report(&d.t.acme1, a)?;
    let gk = d.report(&d.t.globex1, g)?;
    for (id, user, k) in [(a, &d.t.acme1, &ak), (g, &d.t.globex1, &gk)] {
        println!("job {id} of {}:", user.name);
        println!("    tenant                 {}", k["TENANCY_TENANT"]);
        println!("    CUDA_VISIBLE_DEVICES   {}", k["CUDA_VISIBLE_DEVICES"]);
        println!("    TMPDIR                 {}", k["TMPDIR"]);
        let get = |key: &str| k.get(key).map(String::as_str).unwrap_or("?");
        println!(
            "    TMPDIR owner, mode     uid {} (the job's user: uid {}), mode {}, writable: {}",
            get("tmpdir_owner"),
            k["uid"],
            get("tmpdir_mode"),
            get("tmpdir_writable")
        );
    }
    println!("\nThe MIG instances on the GPUs now (nvml-shim-ctl list):");
    show(&s.shim_ctl(&["list"])?);
    println!("\nDCGM exporter's job mapping (<gpu>.<gpu instance>: job ids):");
    show_mapping(&dcgm);
    println!("\ntenancyctl metrics (excerpt; node_exporter's textfile collector reads it all):");
    let mut c = s.tenancyctl();
    c.arg("metrics");
    let m = s.cluster.run(c)?;
    for l in text(&m.stdout).lines().filter(|l| {
        l.starts_with("slurm_tenancy_jobs_running")
            || l.starts_with("slurm_tenancy_mig_slices_in_use")
            || l.starts_with("slurm_tenancy_job_path_seconds_count")
            || l.starts_with("slurm_tenancy_jobs_refused")
            || l.starts_with("slurm_tenancy_audit_chain_head_seq")
    }) {
        println!("    {l}");
    }

    say("Attacks by globex's job on acme's job (both running)");
    let secret = format!("{}/secret.txt", ak["TMPDIR"]);
    let v = d.attack(&d.t.acme1, a, &["read", &secret], "read")?;
    println!("    acme reads its own file: {} ({v})", outcome(&v, false));
    let v = d.attack(&d.t.globex1, g, &["read", &secret], "read")?;
    println!(
        "    globex reads acme's scratch: {} -> {}",
        describe(&v),
        outcome(&v, true)
    );
    broken += u32::from(v.starts_with("ok"));

    match s.made(g, "devices")? {
        Some(_) => {
            let minors = s
                .shim_instances()?
                .into_iter()
                .find(|r| r["mig_uuid"].as_str() == Some(ak["CUDA_VISIBLE_DEVICES"].as_str()))
                .and_then(|r| r["cap_minors"].as_str().map(String::from))
                .unwrap_or_default();
            if let Some(m) = minors.split(',').next_back().filter(|m| !m.is_empty()) {
                let node = s.paths.dev_dir.join(format!("nvidia-caps/nvidia-cap{m}"));
                let node = node.display().to_string();
                let v = d.attack(&d.t.globex1, g, &["open", &node], "open")?;
                println!(
                    "    globex opens acme's MIG device node: {} -> {}",
                    describe(&v),
                    outcome(&v, true)
                );
                broken += u32::from(v != "EPERM");
                match d.adopted_session(g, &node)? {
                    Some(v) => {
                        println!(
                            "    globex's ssh session opens acme's MIG device node: {} -> {}",
                            describe(&v),
                            outcome(&v, true)
                        );
                        broken += u32::from(v != "EPERM");
                    }
                    None => println!("    (no extern step: ssh session check skipped)"),
                }
            }
        }
        None => println!("    (device allowlist not in this build: device attack skipped)"),
    }
    match s.made(g, "network")? {
        Some(_) => {
            let target = format!("127.0.0.1:{a_port}");
            let v = d.attack(&d.t.globex1, g, &["connect", &target, "2000"], "connect")?;
            println!(
                "    globex connects to acme's port {a_port}: {} -> {}",
                describe(&v),
                outcome(&v, true)
            );
            broken += u32::from(v.starts_with("ok"));
        }
        None => println!("    (firewall not in this build: port attack skipped)"),
    }
    if s.firewall {
        println!("\nDrops counted per tenant (tenancyctl firewall show):");
        let mut c = s.tenancyctl();
        c.args(["firewall", "show"]);
        show(&s.cluster.run(c)?);
    }

    say("Jobs end: slices destroyed, scratch wiped (acme) or retained (globex)");
    fs::write(&d.release, "")?;
    for id in [a, g] {
        let info = s.cluster.wait_job_done(id, Duration::from_secs(60))?;
        println!(
            "job {id}: {} (exit {})",
            info["JobState"],
            info.get("ExitCode").map(String::as_str).unwrap_or("?")
        );
    }
    let t0 = Instant::now();
    while (s.journal(a)?.is_some() || s.journal(g)?.is_some())
        && t0.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    let left = s.shim_instances()?.len();
    println!("MIG instances left on the GPUs: {left}");
    println!("DCGM job mapping files left:");
    show_mapping(&dcgm);
    for (k, name) in [(&ak, "acme"), (&gk, "globex")] {
        let p = Path::new(&k["TMPDIR"]);
        println!(
            "{name} scratch {}: {}",
            p.display(),
            if p.exists() { "still there" } else { "gone" }
        );
    }
    let retained = s.paths.scratch_root.join("globex/.retained");
    for e in fs::read_dir(&retained).into_iter().flatten().flatten() {
        println!("  retained: {}", e.path().display());
    }
    if scratch_fs.is_some() {
        broken += show_locked_scratch(d, g)?;
    }
    println!("node {} is {}", s.cluster.node, s.cluster.node_state()?);

    let audit = s.paths.audit_log.display().to_string();
    say(&format!("tenancyctl report --by tenant {audit}"));
    let mut c = s.tenancyctl();
    c.args(["report", "--by", "tenant", &audit]);
    show(&s.cluster.run(c)?);
    // Anchors go to syslog, which takes a line from any user: acme1 writes one for a chain
    // head past the log's end, as `logger` would (here into a file of theirs: this machine
    // may have no syslog daemon). Without the anchor key, verify would report a cut log.
    say("acme1 forges an anchor: the line `logger -t tenancy-audit` would leave in syslog");
    let forged = s.cluster.user_dir(&d.t.acme1).join("syslog");
    let line = format!(
        "Nov 30 12:00:00 {} tenancy-audit: node={} seq=999999 hash={}",
        s.cluster.node,
        s.cluster.node,
        "0".repeat(64)
    );
    let mut c = s.cluster.cmd_as(&d.t.acme1, "sh");
    c.args(["-c", "printf '%s\\n' \"$1\" > \"$2\"", "sh", &line])
        .arg(&forged);
    let o = s.cluster.run(c)?;
    println!(
        "{line}\n    (written by acme1: exit {})",
        o.status.code().unwrap_or(-1)
    );
    let (anchors, forged) = (
        s.paths.audit_anchors.display().to_string(),
        forged.display().to_string(),
    );
    say(&format!(
        "tenancyctl audit verify --all-nodes --anchor {anchors} --anchor {forged} {audit}   (the config's anchor key; the cluster's one node's log)"
    ));
    let mut c = s.tenancyctl();
    c.args([
        "audit",
        "verify",
        "--all-nodes",
        "--anchor",
        &anchors,
        "--anchor",
        &forged,
        &audit,
    ]);
    let o = s.cluster.run(c)?;
    show(&o);
    println!("    (exit {})", o.status.code().unwrap_or(-1));
    let out = String::from_utf8_lossy(&o.stdout);
    if !o.status.success() || !out.contains("without a valid MAC left out") {
        broken += 1;
    }

    broken += statement_and_cross_check(s, &[a, g])?;
    broken += verify_at_collector(s, &collector, forwarder, &public_keys)?;
    broken += quota_and_pool(&demo)?;

    say("Shutting the cluster down");
    drop(demo);
    // The encrypted scratch root's file system, after the cluster (and its epilogs) stopped.
    drop(scratch_fs);
    drop(users);
    drop(root);
    println!("done: daemons stopped, users and temp folders removed");
    if broken == 0 {
        println!("every isolation check held");
    }
    Ok(broken)
}

/// The month's priced statement as HTML files that outlive the demo, and the cross-check of the
/// audit log with Slurm's accounting (sacct). Returns 1 when the books disagree.
fn statement_and_cross_check(s: &Stack, jobs: &[u64]) -> Result<u32> {
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
struct Collector {
    dir: PathBuf,
    port: u16,
    pid: i32,
}

impl Collector {
    fn start(dir: &Path) -> Result<Collector> {
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
fn verify_at_collector(
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

/// Each mapping file with the job ids it lists, or that there is none.
/// globex's retained scratch is locked (its key removed at job end): root reads nothing of it
/// until the admin unlocks it with `tenancyctl scratch unlock`; locked again after. Returns
/// the number of checks that did not hold.
fn show_locked_scratch(d: &Demo, job: u64) -> Result<u32> {
    let s = &d.stack;
    say(&format!(
        "globex's retained scratch of job {job} is encrypted and locked: root reads nothing"
    ));
    let folders = tenancy_scratch::find_retained(&s.paths.scratch_root, job, Some("globex"))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let Some(f) = folders.first() else {
        println!("    no retained folder of job {job}");
        return Ok(1);
    };
    println!(
        "    {} (key {})",
        f.path.display(),
        f.key_id
            .map(|k| k.to_string())
            .unwrap_or_else(|| "none: NOT ENCRYPTED".into())
    );
    let files: Vec<_> = fs::read_dir(&f.path)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.path())
        .collect();
    let mut broken = u32::from(f.key_id.is_none());
    let read = |p: &Path| match fs::read(p) {
        Ok(b) => format!("readable ({} bytes)", b.len()),
        Err(e) => format!("{e}"),
    };
    for p in &files {
        let r = read(p);
        println!("    root reads {}: {r}", p.display());
        if !r.contains("Required key not available") {
            broken += 1;
        }
    }
    for verb in ["unlock", "lock"] {
        say(&format!(
            "tenancyctl scratch {verb} {job} (root only; audited)"
        ));
        let mut c = s.tenancyctl();
        c.args(["scratch", verb, &job.to_string()]);
        let o = s.cluster.run(c)?;
        show(&o);
        if !o.status.success() {
            broken += 1;
        }
        if verb == "unlock" {
            let names: Vec<String> = fs::read_dir(&f.path)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            println!("    files now: {}", names.join(", "));
        }
    }
    Ok(broken)
}

fn show_mapping(dir: &Path) {
    let mut files: Vec<_> = fs::read_dir(dir).into_iter().flatten().flatten().collect();
    files.sort_by_key(|e| e.file_name());
    if files.is_empty() {
        println!("    (none)");
    }
    for e in files {
        let jobs = fs::read_to_string(e.path()).unwrap_or_default();
        println!(
            "    {}: {}",
            e.file_name().to_string_lossy(),
            jobs.split_whitespace().collect::<Vec<_>>().join(" ")
        );
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("0.0.0.0:0")?
        .local_addr()?
        .port())
}

/// The tenants' accounts, users and limits in slurmdbd (`tenancyctl slurm sync --apply`),
/// then a wait until slurmctld has the users' associations (it refuses jobs without one).
fn sync_tenants(s: &Stack, t: &Tenants) -> Result<()> {
    say("tenancyctl slurm sync --apply: the tenants' accounts, users and quotas in slurmdbd");
    let mut c = s.tenancyctl();
    c.args(["slurm", "sync", "--apply"]);
    let o = s.cluster.run(c)?;
    show(&o);
    if !o.status.success() {
        bail!("tenancyctl slurm sync --apply failed (above)");
    }
    let t0 = Instant::now();
    loop {
        let mut q = s.cluster.cmd("scontrol");
        q.args(["show", "assoc_mgr", "flags=users"]);
        let out = text(&s.cluster.run(q)?.stdout);
        if [&t.acme1, &t.globex1, &t.both]
            .iter()
            .all(|u| out.contains(&format!("UserName={}(", u.name)))
        {
            return Ok(());
        }
        if t0.elapsed() > Duration::from_secs(60) {
            bail!("slurmctld does not have the tenants' users after 60 s: {out}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A job over its tenant's quota waits with Slurm's reason; a node pool keeps other tenants
/// out. Returns the number of checks that did not hold.
fn quota_and_pool(d: &Demo) -> Result<u32> {
    let s = &d.stack;
    let mut broken = 0;
    say("Quotas: acme may hold one 1g.18gb slice at a time; its second job waits in the queue");
    let mut ids = Vec::new();
    for _ in 0..2 {
        let args = [
            "--tenant=acme",
            "--mig=1g.18gb",
            "--gres=gpu:1g.18gb:1",
            "--no-requeue",
        ];
        println!(
            "{} $ sbatch {} --wrap 'sleep 120'",
            d.t.acme1.name,
            args.join(" ")
        );
        let mut c = s.cluster.cmd_as(&d.t.acme1, "sbatch");
        c.args(args)
            .args(["-o", "/dev/null", "--wrap", "sleep 120"]);
        let o = s.cluster.run(c)?;
        show(&o);
        if o.status.success() {
            ids.push(submitted_id(&o)?);
        }
    }
    if let [first, second] = ids[..] {
        let _ = s
            .cluster
            .wait_job(first, &["RUNNING"], Duration::from_secs(60));
        let t0 = Instant::now();
        let mut reason = String::new();
        while t0.elapsed() < Duration::from_secs(60) {
            reason = s
                .cluster
                .job_info(second)?
                .get("Reason")
                .cloned()
                .unwrap_or_default();
            if reason == "AssocGrpGRES" {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        let mut q = s.cluster.cmd("squeue");
        q.args([
            "-o",
            "%.6i %.8u %.9a %.8T %r",
            "-j",
            &format!("{first},{second}"),
        ]);
        show(&s.cluster.run(q)?);
        if reason == "AssocGrpGRES" {
            println!(
                "job {second} waits for acme's quota (Slurm's reason AssocGrpGRES); node {} is {}",
                s.cluster.node,
                s.cluster.node_state()?
            );
        } else {
            println!("CHECK FAILED: job {second} is not waiting on its quota (reason {reason:?})");
            broken += 1;
        }
    } else {
        println!("CHECK FAILED: the quota jobs were not accepted");
        broken += 1;
    }
    let mut c = s.cluster.cmd("scancel");
    c.args(ids.iter().map(|i| i.to_string()));
    s.cluster.run(c)?;

    say(&format!(
        "Node pools: globex gets node {} for itself (nodes = \"{}\")",
        s.cluster.node, s.cluster.node
    ));
    let toml = fs::read_to_string(&s.config)?.replacen(
        "accounts = [\"globex\"]\n",
        &format!("accounts = [\"globex\"]\nnodes = \"{}\"\n", s.cluster.node),
        1,
    );
    fs::write(&s.config, toml)?;
    let mut c = s.tenancyctl();
    c.args(["doctor", "--format", "csv"]);
    let doctor = text(&s.cluster.run(c)?.stdout);
    for l in doctor.lines().filter(|l| l.starts_with("scheduler.pools")) {
        println!("    doctor: {l}");
    }
    let g = d.submit(&d.t.globex1, &["--tenant=globex"], 0)?;
    let a = d.submit(&d.t.acme1, &["--tenant=acme"], 0)?;
    if a.is_some() {
        println!("CHECK FAILED: acme's job was accepted although the only node is globex's");
        broken += 1;
    }
    if let Some(g) = g {
        let info = s.cluster.wait_job(
            g,
            &["RUNNING", "COMPLETED", "FAILED"],
            Duration::from_secs(60),
        )?;
        println!(
            "globex's job {g}: {} on {}",
            info["JobState"], info["NodeList"]
        );
        let mut c = s.cluster.cmd("scancel");
        c.arg(g.to_string());
        s.cluster.run(c)?;
    }
    Ok(broken)
}
