//! Quotas and pools: the tenants' limits synced into slurmdbd, a job waiting on its tenant's
//! quota, and a node pool keeping another tenant out.

use super::{say, show, text, Demo};
use anyhow::{bail, Result};
use std::fs;
use std::time::{Duration, Instant};
use tenancy_e2e::{submitted_id, Stack, Tenants};

/// The tenants' accounts, users and limits in slurmdbd (`tenancyctl slurm sync --apply`),
/// then a wait until slurmctld has the users' associations (it refuses jobs without one).
pub(crate) fn sync_tenants(s: &Stack, t: &Tenants) -> Result<()> {
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
pub(crate) fn quota_and_pool(d: &Demo) -> Result<u32> {
    Ok(quota(d)? + pool(d)?)
}

/// acme's second job over its one-slice quota waits with Slurm's reason AssocGrpGRES.
fn quota(d: &Demo) -> Result<u32> {
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
    Ok(broken)
}

/// A node pool of globex's alone: globex's job runs there, acme's is refused.
fn pool(d: &Demo) -> Result<u32> {
    let s = &d.stack;
    let mut broken = 0;
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
