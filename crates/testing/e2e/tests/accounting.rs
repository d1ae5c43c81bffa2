//! The two books on a real cluster: Slurm's accounting (slurmdbd over MariaDB, the MIG
//! profiles as typed GPU GRES in AccountingStorageTRES, read with `sacct`) and the product's
//! audit log, compared job by job with `tenancyctl report --compare-sacct`. Needs root.

use std::time::{Duration, Instant};
use tenancy_e2e::{scenario, submitted_id, Accounting, Env, Options, Stack, TestUser};

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn submit(stack: &Stack, user: &TestUser, args: &[&str], secs: u32) -> u64 {
    let mut c = stack.cluster.cmd_as(user, "sbatch");
    c.args(args)
        .arg("--no-requeue")
        .args(["-o", "/dev/null", "--wrap"])
        .arg(format!("sleep {secs}"));
    let o = stack.cluster.run(c).unwrap();
    assert!(o.status.success(), "sbatch {args:?}: {}", text(&o));
    submitted_id(&o).unwrap()
}

/// `sacct` rows of the cluster's jobs (parsable, with header), once every job in `ids` shows
/// there as ended: slurmctld sends job records to slurmdbd on its own time.
fn sacct_when_ended(stack: &Stack, ids: &[u64]) -> String {
    let t = Instant::now();
    loop {
        let mut c = stack.cluster.cmd("sacct");
        c.env("TZ", "UTC").args([
            "-a",
            "-X",
            "--parsable2",
            "-o",
            "JobIDRaw,Cluster,NodeList,State,Start,End,ElapsedRaw,AllocTRES",
        ]);
        let o = stack.cluster.run(c).unwrap();
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        let ended = ids.iter().all(|id| {
            out.lines().any(|l| {
                l.starts_with(&format!("{id}|"))
                    && !l.contains("|RUNNING|")
                    && !l.contains("|PENDING|")
            })
        });
        if o.status.success() && ended {
            return out;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "sacct does not show jobs {ids:?} ended after 60 s: {}",
            text(&o)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn compare(stack: &Stack, tolerance_seconds: u32) -> std::process::Output {
    let o = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d"])
        .output()
        .unwrap();
    let today = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let mut c = stack.tenancyctl();
    c.env("TZ", "UTC").args([
        "report",
        "--compare-sacct",
        "--since",
        &today,
        "--until",
        &today,
        "--tolerance-seconds",
        &tolerance_seconds.to_string(),
    ]);
    c.arg(&stack.paths.audit_log);
    stack.cluster.run(c).unwrap()
}

/// Slurm's accounting with the MIG profiles the jobs ask for as typed GPU GRES.
fn accounting() -> Accounting {
    Accounting {
        gpu_types: vec![
            ("1g.18gb".into(), 7),
            ("2g.35gb".into(), 3),
            ("3g.71gb".into(), 2),
        ],
    }
}

scenario!(
    compare_sacct_agrees_on_the_e2e_jobs,
    Options::default().accounting(accounting()),
    |e: &mut Env| compare_sacct_agrees(e)
);

fn compare_sacct_agrees(e: &Env) {
    let (stack, t) = (&e.stack, &e.t);

    // Jobs with a MIG slice ask Slurm for the same profile as typed GPU GRES, so slurmctld
    // accounts what the prolog makes; one job has no slice.
    let a = submit(
        stack,
        &t.acme1,
        &["--tenant=acme", "--mig=1g.18gb", "--gres=gpu:1g.18gb:1"],
        4,
    );
    let g = submit(
        stack,
        &t.globex1,
        &["--tenant=globex", "--mig=3g.71gb", "--gres=gpu:3g.71gb:1"],
        3,
    );
    let n = submit(stack, &t.acme1, &["--tenant=acme"], 1);
    for id in [a, g, n] {
        let info = stack
            .cluster
            .wait_job_done(id, Duration::from_secs(90))
            .unwrap();
        assert_eq!(info["JobState"], "COMPLETED", "job {id}: {info:?}");
        assert_eq!(
            stack.audit_events(id).unwrap(),
            ["job_start", "job_end"],
            "job {id}"
        );
    }
    let sacct = sacct_when_ended(stack, &[a, g, n]);
    eprintln!("sacct:\n{sacct}");
    assert!(
        sacct
            .lines()
            .any(|l| l.starts_with(&format!("{a}|")) && l.contains("gres/gpu:1g.18gb=1")),
        "Slurm did not account job {a}'s MIG slice as typed GRES: {sacct}"
    );

    // The tolerance a site would run with: the prolog and epilog's own seconds.
    let o = compare(stack, 60);
    let out = text(&o);
    eprintln!("tenancyctl report --compare-sacct:\n{out}");
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("3 Slurm job(s), 3 job_start record(s), 2 usage figure(s) compared")
            && out.contains("the books agree"),
        "{out}"
    );

    // A job Slurm bills for one profile while the prolog made another: the books disagree,
    // for that job alone, on both profiles. job_submit/tenancy refuses such a job; a controller
    // without it (doctor warns of one) takes it, and the cross-check is what shows it then.
    let m = without_job_submit_check(stack, || {
        submit(
            stack,
            &t.acme1,
            &["--tenant=acme", "--mig=2g.35gb", "--gres=gpu:1g.18gb:1"],
            20,
        )
    });
    let info = stack
        .cluster
        .wait_job_done(m, Duration::from_secs(150))
        .unwrap();
    assert_eq!(info["JobState"], "COMPLETED", "job {m}: {info:?}");
    sacct_when_ended(stack, &[m]);
    // Slurm's 20 s of 1g.18gb against the audit log's 20 s of 2g.35gb, each beyond 10 s.
    let o = compare(stack, 10);
    let out = text(&o);
    eprintln!("tenancyctl report --compare-sacct (a mismatched job):\n{out}");
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains(&format!(
            "DISAGREE job {m} on {}: usage_differs: profile 1g.18gb",
            stack.cluster.node
        )) && out.contains(&format!(
            "DISAGREE job {m} on {}: usage_differs: profile 2g.35gb",
            stack.cluster.node
        )),
        "{out}"
    );
    assert_eq!(out.matches("DISAGREE").count(), 2, "{out}");
}

/// Runs `f` while slurmctld runs without job_submit/tenancy (slurm.conf without the line,
/// `scontrol reconfigure`), then puts the plugin back.
fn without_job_submit_check<T>(stack: &Stack, f: impl FnOnce() -> T) -> T {
    let conf = std::fs::read_to_string(&stack.cluster.conf).unwrap();
    let reconfigure = |conf_text: &str| {
        std::fs::write(&stack.cluster.conf, conf_text).unwrap();
        let mut c = stack.cluster.cmd("scontrol");
        c.arg("reconfigure");
        let o = stack.cluster.run(c).unwrap();
        assert!(o.status.success(), "scontrol reconfigure: {}", text(&o));
    };
    let without: String = conf
        .lines()
        .filter(|l| !l.starts_with("JobSubmitPlugins="))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(without, conf, "slurm.conf names the plugin");
    reconfigure(&without);
    let r = f();
    reconfigure(&conf);
    r
}

/// GRES slot mode: every slot of the MIG plan (`[mig.plan]`, per H200: one 3g.71gb and four
/// 1g.18gb) is a typed GRES record of slurmctld's, as layers/mig/README.md has it, on the
/// stand-in's two H200s.
fn slot_mode() -> Options {
    Options::default()
        .accounting(Accounting {
            gpu_types: vec![("3g.71gb".into(), 2), ("1g.18gb".into(), 8)],
        })
        .config(|c| {
            c.mig_plan("H200-141GB")
                .instances("3g.71gb", 1)
                .instances("1g.18gb", 4);
        })
}

/// sbatch as `user`; the refusal's text, or the job id.
fn sbatch(stack: &Stack, user: &TestUser, args: &[&str]) -> Result<u64, String> {
    let mut c = stack.cluster.cmd_as(user, "sbatch");
    c.args(args)
        .arg("--no-requeue")
        .args(["-o", "/dev/null", "--wrap", "true"]);
    let o = stack.cluster.run(c).unwrap();
    if o.status.success() {
        Ok(submitted_id(&o).unwrap())
    } else {
        Err(text(&o))
    }
}

fn no_job_and_node_idle(stack: &Stack) {
    let mut q = stack.cluster.cmd("squeue");
    q.args(["-h", "-o", "%i"]);
    let o = stack.cluster.run(q).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "",
        "no job was made"
    );
    assert_eq!(stack.cluster.node_state().unwrap(), "idle");
}

scenario!(
    mig_without_matching_gres_is_refused_at_submit,
    slot_mode(),
    |e: &mut Env| {
        let (stack, t) = (&e.stack, &e.t);
        // A slice Slurm does not know of would take a slot it hands another job.
        let err = sbatch(stack, &t.acme1, &["--tenant=acme", "--mig=1g.18gb"]).unwrap_err();
        assert!(
            err.contains("tenancy:")
                && err.contains("--mig=1g.18gb")
                && err.contains("--gres=gpu:1g.18gb:1"),
            "the refusal names the option and the GRES to add: {err}"
        );
        no_job_and_node_idle(stack);
        // One profile made, another billed.
        for gres in [
            "--gres=gpu:3g.71gb:1",
            "--gpus=3g.71gb:1",
            "--gpus-per-node=3g.71gb:1",
        ] {
            let err =
                sbatch(stack, &t.acme1, &["--tenant=acme", "--mig=1g.18gb", gres]).unwrap_err();
            assert!(
                err.contains("--mig=1g.18gb")
                    && err.contains("gpu:3g.71gb:1")
                    && err.contains("disagree"),
                "{gres}: the refusal names both: {err}"
            );
        }
        // An untyped GPU can be any slot; a MIG slot without --mig gets no slice.
        let err = sbatch(
            stack,
            &t.acme1,
            &["--tenant=acme", "--mig=1g.18gb", "--gres=gpu:1"],
        )
        .unwrap_err();
        assert!(
            err.contains("gpu:1") && err.contains("--mig=1g.18gb"),
            "{err}"
        );
        let err = sbatch(stack, &t.acme1, &["--tenant=acme", "--gres=gpu:1g.18gb:1"]).unwrap_err();
        assert!(
            err.contains("no --mig") && err.contains("--mig=1g.18gb"),
            "{err}"
        );
        // srun and salloc ask slurmctld the same way.
        for client in ["srun", "salloc"] {
            let mut c = stack.cluster.cmd_as(&t.acme1, client);
            c.args(["--tenant=acme", "--mig=1g.18gb", "true"]);
            let o = stack.cluster.run(c).unwrap();
            assert!(!o.status.success(), "{client} without GRES ran");
            assert!(
                text(&o).contains("--gres=gpu:1g.18gb:1"),
                "{client}: {}",
                text(&o)
            );
        }
        no_job_and_node_idle(stack);

        // Both naming one profile: the job runs in that slot, and Slurm accounts it.
        let id = sbatch(
            stack,
            &t.acme1,
            &["--tenant=acme", "--mig=1g.18gb", "--gres=gpu:1g.18gb:1"],
        )
        .unwrap();
        let info = stack
            .cluster
            .wait_job_done(id, Duration::from_secs(90))
            .unwrap();
        assert_eq!(info["JobState"], "COMPLETED", "{info:?}");
        assert_eq!(stack.audit_events(id).unwrap(), ["job_start", "job_end"]);
        assert_eq!(stack.cluster.node_state().unwrap(), "idle");
    }
);

scenario!(
    gres_update_of_pending_job_is_refused,
    slot_mode(),
    |e: &mut Env| {
        let (stack, t) = (&e.stack, &e.t);
        let id = sbatch(
            stack,
            &t.acme1,
            &[
                "--tenant=acme",
                "--mig=1g.18gb",
                "--gres=gpu:1g.18gb:1",
                "--hold",
            ],
        )
        .unwrap();
        let tres = || {
            let info = stack.cluster.job_info(id).unwrap();
            info.get("TresPerNode").cloned().unwrap_or_default()
        };
        let before = tres();
        assert!(before.contains("1g.18gb"), "{before}");
        // The owner may not move the pending job to another GPU type (Slurm alone lets them).
        for gres in ["Gres=gpu:3g.71gb:1", "TresPerNode=gres/gpu:3g.71gb:1"] {
            let mut c = stack.cluster.cmd_as(&t.acme1, "scontrol");
            c.args(["update", &format!("JobId={id}"), gres]);
            let o = stack.cluster.run(c).unwrap();
            assert!(
                !o.status.success(),
                "update {gres} was accepted: {}",
                text(&o)
            );
            assert_eq!(tres(), before, "the job's GRES after {gres}");
        }
        assert_eq!(stack.cluster.node_state().unwrap(), "idle");
        let mut c = stack.cluster.cmd("scancel");
        c.arg(id.to_string());
        stack.cluster.run(c).unwrap();
    }
);
