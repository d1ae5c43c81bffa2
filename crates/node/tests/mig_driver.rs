//! MIG as the real driver behaves: the failure modes operators of dynamic MIG report (NVIDIA's
//! DRA driver, HAMi, mig-parted and DCGM issue trackers), each modelled by the NVML stand-in
//! (nvml-shim/README.md, "Modelled driver behaviour") and met by the real `tenancy-prolog` and
//! `tenancy-epilog` (which hand MIG jobs to `tenancy-prolog-dynamic`), real layers and users.

mod common;

use common::{built_or_skip, requires_root, text, World};
use serde_json::Value;
use std::ffi::OsString;
use std::io::BufRead;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use tenancy_audit_log::{Event, Outcome};

/// A root test's world of `gpus` H200s, with the real binaries; None: skip.
fn world(gpus: usize) -> Option<World> {
    if !requires_root("real cgroups, nftables, mknod and users under the prolog and epilog") {
        return None;
    }
    let w = World::new(gpus, None)?;
    for b in [
        "tenancy-prolog",
        "tenancy-epilog",
        "tenancy-prolog-dynamic",
        "tenancyctl",
    ] {
        built_or_skip(b)?;
    }
    Some(w)
}

fn run(w: &World, name: &str, env: &[(OsString, OsString)]) -> Output {
    w.command_of(&built_or_skip(name).unwrap(), &[], env)
        .output()
        .unwrap()
}

fn prolog(w: &World, env: &[(OsString, OsString)]) -> Output {
    run(w, "tenancy-prolog", env)
}

fn epilog(w: &World, env: &[(OsString, OsString)]) -> Output {
    run(w, "tenancy-epilog", env)
}

/// The prolog, which must succeed ("prolog: " and what it printed otherwise).
fn prolog_ok(w: &World, env: &[(OsString, OsString)]) -> Output {
    prolog_ok_as(w, env, "prolog")
}

/// Jobs 1 and 2's ids, and job 1 (tenant 0, GPU profile `profile`) started: its environment.
fn first_job(w: &World, profile: &str) -> (u64, u64, Vec<(OsString, OsString)>) {
    let (j1, j2) = (jobs(1), jobs(2));
    let e1 = w.job_env(j1, 0, Some(profile));
    prolog_ok(w, &e1);
    (j1, j2, e1)
}

/// A run that must fail (`what` names it in the failure message): its stderr.
fn refused(out: Output, what: &str) -> String {
    assert!(!out.status.success(), "{what}: {}", text(&out));
    stderr(&out)
}

/// The epilog, which must succeed.
fn epilog_ok(w: &World, env: &[(OsString, OsString)]) -> Output {
    let out = epilog(w, env);
    assert!(out.status.success(), "epilog: {}", text(&out));
    out
}

/// The prolog, which must succeed; `what` names it in the failure message.
fn prolog_ok_as(w: &World, env: &[(OsString, OsString)], what: &str) -> Output {
    let out = prolog(w, env);
    assert!(out.status.success(), "{what}: {}", text(&out));
    out
}

fn ctl_cmd(w: &World) -> Command {
    let mut c = Command::new(w.shim.with_file_name("nvml-shim-ctl"));
    c.env("NVML_SHIM_FIXTURE", w.root.join("fixture.toml"))
        .env_remove("NVML_SHIM_STATE")
        .env_remove("NVML_SHIM_FAULTS");
    c
}

/// `nvml-shim-ctl args...`, which must succeed; its stdout.
fn ctl(w: &World, args: &[&str]) -> String {
    let out = ctl_cmd(w).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "nvml-shim-ctl {args:?}: {}",
        text(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Replaces the stand-in's fixture (top-level keys `extra`, one `[[gpus]]` table per entry of
/// `gpus`) and brings its state back to it, as a node booted with these GPUs.
fn set_fixture(w: &World, extra: &str, gpus: &[&str]) {
    let r = w.root.display();
    let mut f = format!(
        "state = \"{r}/shim-state.json\"\ndev_dir = \"{r}/dev\"\nmig_minors = \"{r}/mig-minors\"\n\
         proc_devices = \"{r}/proc-devices\"\n{extra}\n"
    );
    for g in gpus {
        f.push_str(&format!("[[gpus]]\n{g}\n"));
    }
    std::fs::write(w.root.join("fixture.toml"), f).unwrap();
    ctl(w, &["reset", "--hard"]);
    ctl(w, &["layout"]);
}

/// Replaces `from` by `to` in the world's config (the binaries read it on every run).
fn edit_config(w: &World, from: &str, to: &str) {
    let toml = std::fs::read_to_string(&w.config_path).unwrap();
    assert!(toml.contains(from), "config has no {from:?}");
    std::fs::write(&w.config_path, toml.replacen(from, to, 1)).unwrap();
}

/// The made value of the job's MIG step.
fn mig_made(w: &World, job: u64) -> Value {
    w.journal_step(job, "mig")
        .unwrap_or_else(|| panic!("job {job} has no MIG step: {}", w.journal(job)))["made"]
        .clone()
}

/// The MIG step's state in the job's journal ("intended", "made", "undone").
fn mig_state(w: &World, job: u64) -> String {
    w.journal_step(job, "mig")
        .map(|s| s["state"].as_str().unwrap_or("?").to_string())
        .unwrap_or_default()
}

/// The job's records in the audit log.
fn records_of(w: &World, job: u64) -> Vec<tenancy_audit_log::Record> {
    w.records()
        .into_iter()
        .filter(|r| r.job_id == Some(job))
        .collect()
}

/// The stand-in's CIs: (gpu, gi, ci id, ci profile id, start, size).
fn cis(w: &World) -> Vec<(usize, u64, u64, u64, u64, u64)> {
    let s = w.shim_state();
    let mut out = Vec::new();
    for (i, g) in s["gpus"].as_array().unwrap().iter().enumerate() {
        for gi in g["gis"].as_array().unwrap() {
            for ci in gi["cis"].as_array().unwrap() {
                let n = |v: &Value, k: &str| v[k].as_u64().unwrap();
                out.push((
                    i,
                    n(gi, "id"),
                    n(ci, "id"),
                    n(ci, "profile_id"),
                    n(ci, "start"),
                    n(ci, "size"),
                ));
            }
        }
    }
    out
}

/// A process of `nvml-shim-ctl hold`, holding the job's capability nodes open, named `name`.
struct Holder(Child);

impl Holder {
    fn start(w: &World, slice: &Value, name: &str, for_ms: Option<u64>) -> Holder {
        let (gpu, gi, ci) = (
            slice["gpu_index"].to_string(),
            slice["gi_id"].to_string(),
            slice["ci_id"].to_string(),
        );
        let mut c = ctl_cmd(w);
        c.args(["hold", &gpu, &gi, "--ci", &ci, "--name", name]);
        if let Some(ms) = for_ms {
            c.args(["--for-ms", &ms.to_string()]);
        }
        let mut child = c
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        if !line.starts_with(&format!("holding {} ", child.id())) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("nvml-shim-ctl hold: {line}{}", text(&out));
        }
        Holder(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Adds `dcgm_job_mapping_dir` to the config and the stand-in's fixture (which then records a
/// GPU instance destroyed or made while its mapping file still lists jobs).
fn with_dcgm_mapping(w: &World) -> PathBuf {
    let dir = w.root.join("dcgm-jobs");
    edit_config(
        w,
        "[cluster]\n",
        &format!("[cluster]\ndcgm_job_mapping_dir = \"{}\"\n", dir.display()),
    );
    set_fixture(
        w,
        &format!("dcgm_job_mapping_dir = \"{}\"", dir.display()),
        &["model = \"H200-141GB\""],
    );
    dir
}

fn stale_mappings(w: &World) -> Vec<String> {
    w.shim_state()["stale_dcgm_mappings"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// The job ids the DCGM mapping files list.
fn mapped_jobs(dir: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return vec![];
    };
    rd.flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .flat_map(|e| {
            std::fs::read_to_string(e.path())
                .unwrap()
                .lines()
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Unique job ids per test process.
fn jobs(n: u64) -> u64 {
    7_800_000 + u64::from(std::process::id() % 10_000) * 100 + n * 10
}

/// A process that keeps the job's instance busy (a monitoring agent, a leftover CUDA process)
/// makes its destroy answer NVML_ERROR_IN_USE. One that lets go within the retry budget costs
/// retries (recorded); one that does not fails the epilog closed, naming it by the capability
/// nodes it holds open, with the journal kept, and the next epilog cleans up once it is gone.
#[test]
fn destroy_in_use_is_retried_and_names_the_holder() {
    let Some(w) = world(1) else { return };
    // Lets go after 600 ms, within the 2 s budget: retried, then destroyed.
    let job = jobs(1);
    let env = w.job_env(job, 0, Some("1g.18gb"));
    prolog_ok(&w, &env);
    let slice = mig_made(&w, job);
    let holder = Holder::start(&w, &slice, "dcgm-exporter", Some(600));
    epilog_ok(&w, &env);
    drop(holder);
    let end = records_of(&w, job).pop().unwrap();
    assert_eq!((end.event, end.outcome), (Event::JobEnd, Outcome::Success));
    let mig = end.resources.iter().find(|r| r.layer == "mig").unwrap();
    let retries = mig.detail["in_use_retries"].as_u64().unwrap_or(0);
    assert!(
        retries >= 1,
        "the in-use answers waited out: {:?}",
        mig.detail
    );
    w.assert_nothing_left("after the holder let go in time");

    // Holds on: the epilog fails closed within its budget and names the holder.
    let job = jobs(2);
    let env = w.job_env(job, 1, Some("1g.18gb"));
    prolog_ok(&w, &env);
    let slice = mig_made(&w, job);
    let holder = Holder::start(&w, &slice, "dcgm-exporter", None);
    let started = Instant::now();
    let out = epilog(&w, &env);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the retries are bounded"
    );
    assert!(
        !out.status.success(),
        "epilog with a holder: {}",
        text(&out)
    );
    let err = stderr(&out);
    let pid = format!("pid {} (dcgm-exporter", holder.pid());
    assert!(err.contains("NVML_ERROR_IN_USE"), "{err}");
    assert!(err.contains(&pid) && err.contains("nvidia-cap"), "{err}");
    let failed = records_of(&w, job).pop().unwrap();
    assert_eq!(
        (failed.event, failed.outcome),
        (Event::TeardownFailed, Outcome::Failure)
    );
    let reason = failed.reason.unwrap_or_default();
    assert!(
        reason.contains(&pid) && reason.contains("IN_USE"),
        "{reason}"
    );
    // The journal stays for reconcile, with the slice not undone; the slice is still there.
    assert_eq!(mig_state(&w, job), "made");
    assert_eq!(w.gis().len(), 1);
    // Once the holder is gone the next epilog (or reconcile) removes everything.
    drop(holder);
    let out = epilog(&w, &env);
    assert!(
        out.status.success(),
        "epilog after the holder: {}",
        text(&out)
    );
    w.assert_nothing_left("after the holder was stopped");
    assert!(w.chain_is_valid());
}

/// The epilog removes the job from DCGM exporter's mapping file before it destroys the GPU
/// instance: DCGM's view lags a change by a second or two, and the exporter labels whatever
/// instance next has the id with the jobs the file lists. The stand-in records every GPU
/// instance destroyed or made while its file still named jobs: there must be none, also when
/// the destroy fails (the instance stays, the ended job is no longer mapped to it).
#[test]
fn dcgm_mapping_removed_before_destroy() {
    let Some(w) = world(1) else { return };
    let dir = with_dcgm_mapping(&w);
    let (j1, j2, j3) = (jobs(1), jobs(2), jobs(3));
    let e1 = w.job_env(j1, 0, Some("1g.18gb"));
    prolog_ok(&w, &e1);
    assert_eq!(mapped_jobs(&dir), vec![j1.to_string()]);
    let gi = mig_made(&w, j1)["gi_id"].clone();
    epilog_ok(&w, &e1);
    assert_eq!(mapped_jobs(&dir), Vec::<String>::new());
    assert_eq!(
        stale_mappings(&w),
        Vec::<String>::new(),
        "mapping left at destroy"
    );

    // The next job gets the same GPU instance id: labelled with its own id only.
    let e2 = w.job_env(j2, 1, Some("1g.18gb"));
    prolog_ok(&w, &e2);
    assert_eq!(mig_made(&w, j2)["gi_id"], gi);
    assert_eq!(mapped_jobs(&dir), vec![j2.to_string()]);
    epilog_ok(&w, &e2);

    // A destroy that stays in use: the mapping is gone all the same.
    let e3 = w.job_env(j3, 0, Some("1g.18gb"));
    prolog_ok(&w, &e3);
    let holder = Holder::start(&w, &mig_made(&w, j3), "nv-hostengine", None);
    let out = epilog(&w, &e3);
    assert!(
        !out.status.success(),
        "epilog with a holder: {}",
        text(&out)
    );
    assert_eq!(w.gis().len(), 1, "the instance stays while held");
    assert_eq!(
        mapped_jobs(&dir),
        Vec::<String>::new(),
        "but is no longer the job's"
    );
    drop(holder);
    epilog_ok(&w, &e3);
    assert_eq!(stale_mappings(&w), Vec::<String>::new());
    w.assert_nothing_left("after the epilogs");
}

/// A compute instance that cannot be made takes its GPU instance with it (the GI leaked in
/// NVIDIA's DRA driver, kubernetes-sigs/dra-driver-nvidia-gpu issue 1452): the prolog fails
/// closed with a rollback record and leaves nothing on the GPU or the node.
#[test]
fn ci_create_failure_rolls_back_its_gi() {
    let Some(w) = world(1) else { return };
    ctl(&w, &["arm", "ci-create", "INSUFFICIENT_RESOURCES"]);
    let job = jobs(1);
    let env = w.job_env(job, 0, Some("3g.71gb"));
    let err = refused(prolog(&w, &env), "prolog");
    assert!(
        err.contains("compute instance creation failed")
            && err.contains("destroyed again (nothing leaked)"),
        "{err}"
    );
    assert_eq!(w.gis(), vec![], "the GPU instance was rolled back");
    let last = records_of(&w, job).pop().unwrap();
    assert_eq!(
        (last.event, last.outcome),
        (Event::Rollback, Outcome::Failure)
    );
    w.assert_nothing_left("after the rolled back prolog");
    // The fault was consumed: the same job runs when requeued.
    prolog_ok_as(&w, &env, "requeued");
    epilog_ok(&w, &env);
    w.assert_nothing_left("after the requeued job");
}

/// A full-GPU instance (7g, 8 memory slices) gets the compute instance of all its 7 compute
/// slices, NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE: not a profile picked by memory slices
/// (8_SLICE, not offered) nor a variant of the same size (NVIDIA's DRA driver took
/// 7_SLICE_NVL for a 7g.40gb on an A100, issue 1480), on an A100-40GB and an H200.
#[test]
fn full_gpu_instance_gets_the_right_ci_profile() {
    let Some(w) = world(2) else { return };
    set_fixture(&w, "", &["model = \"A100-40GB\"", "model = \"H200-141GB\""]);
    edit_config(
        &w,
        "mig_profiles = [\"1g.18gb\", \"3g.71gb\"]",
        "mig_profiles = [\"1g.18gb\", \"3g.71gb\", \"7g.40gb\", \"7g.141gb\"]",
    );
    let (j1, j2) = (jobs(1), jobs(2));
    let e1 = w.job_env(j1, 0, Some("7g.40gb"));
    let e2 = w.job_env(j2, 0, Some("7g.141gb"));
    for (env, job) in [(&e1, j1), (&e2, j2)] {
        let out = prolog(&w, env);
        assert!(out.status.success(), "prolog {job}: {}", text(&out));
    }
    let m1 = mig_made(&w, j1);
    let m2 = mig_made(&w, j2);
    assert_eq!(
        (m1["gpu_index"].as_u64(), m1["gi_id"].as_u64()),
        (Some(0), Some(0))
    );
    assert_eq!(
        (m2["gpu_index"].as_u64(), m2["gi_id"].as_u64()),
        (Some(1), Some(0))
    );
    // GI 0 (7g, placement 0:8) on each GPU; its one CI: profile 4 (7_SLICE), slices 0..7.
    assert_eq!(w.gis(), vec![(0, 0, 0, 8), (1, 0, 0, 8)]);
    assert_eq!(cis(&w), vec![(0, 0, 0, 4, 0, 7), (1, 0, 0, 4, 0, 7)]);
    for (env, job) in [(&e1, j1), (&e2, j2)] {
        let out = epilog(&w, env);
        assert!(out.status.success(), "epilog {job}: {}", text(&out));
    }
    w.assert_nothing_left("after the full-GPU jobs");
}

/// A GPU in confidential-computing mode cannot be sliced: the prolog passes over it to another
/// GPU, and refuses with the reason when none is left.
#[test]
fn cc_mode_gpu_is_refused() {
    let Some(w) = world(2) else { return };
    ctl(&w, &["cc", "0", "on"]);
    let (j1, j2, e1) = first_job(&w, "1g.18gb");
    assert_eq!(
        mig_made(&w, j1)["gpu_index"],
        1,
        "placed on the GPU not in CC mode"
    );
    epilog_ok(&w, &e1);
    // (A CC mode change resets the GPU: it is made on an idle one.)
    ctl(&w, &["cc", "1", "on"]);
    let e2 = w.job_env(j2, 1, Some("1g.18gb"));
    let err = refused(prolog(&w, &e2), "prolog with no GPU left");
    assert!(
        err.contains("GPU 0") && err.contains("GPU 1") && err.contains("confidential-computing"),
        "{err}"
    );
    let last = records_of(&w, j2).pop().unwrap();
    assert!(
        last.reason
            .unwrap_or_default()
            .contains("confidential-computing mode"),
        "the record names the reason"
    );
    assert_eq!(w.gis(), vec![], "nothing made for the refused job");
    w.assert_nothing_left("after the CC refusals");
}

/// A GPU whose MIG mode change waits for a reset (an administrator is taking it out of MIG)
/// gets no new slice: another GPU where there is one, the reason otherwise.
#[test]
fn reset_pending_gpu_is_refused() {
    let Some(w) = world(2) else { return };
    ctl(&w, &["mig", "0", "off", "--pending"]);
    let (j1, j2, e1) = first_job(&w, "3g.71gb");
    assert_eq!(mig_made(&w, j1)["gpu_index"], 1);
    ctl(&w, &["mig", "1", "off", "--pending"]);
    let e2 = w.job_env(j2, 1, Some("1g.18gb"));
    let err = refused(prolog(&w, &e2), "prolog");
    assert!(err.contains("pending a GPU reset"), "{err}");
    assert!(err.contains("nvidia-smi -r -i 0"), "says what to do: {err}");
    assert_eq!(w.gis().len(), 1);
    // The running job's slice is still removed (the GPU is still in MIG mode until the reset).
    epilog_ok(&w, &e1);
    w.assert_nothing_left("after the pending-reset refusals");
}

/// A GPU that falls off the bus (Xid 79) while a job runs: the epilog cannot destroy its slice
/// and fails closed (teardown_failed, journal kept); the next job goes to another GPU; once
/// the GPU is back the next epilog removes the slice.
#[test]
fn lost_gpu_fails_closed() {
    let Some(w) = world(2) else { return };
    let (j1, j2, e1) = first_job(&w, "1g.18gb");
    let gpu = mig_made(&w, j1)["gpu_index"].as_u64().unwrap();
    ctl(&w, &["arm", "lose-gpu", &gpu.to_string()]);
    let err = refused(epilog(&w, &e1), "epilog on a lost GPU");
    assert!(
        err.contains("fell off the bus") && err.contains("GPU_IS_LOST"),
        "{err}"
    );
    let failed = records_of(&w, j1).pop().unwrap();
    assert_eq!(failed.event, Event::TeardownFailed);
    assert_eq!(mig_state(&w, j1), "made", "the journal keeps the slice");
    // The other GPU still takes jobs.
    let e2 = w.job_env(j2, 1, Some("1g.18gb"));
    let out = prolog(&w, &e2);
    assert!(
        out.status.success(),
        "prolog beside a lost GPU: {}",
        text(&out)
    );
    assert_ne!(mig_made(&w, j2)["gpu_index"].as_u64().unwrap(), gpu);
    epilog_ok(&w, &e2);
    // Every GPU lost: refused, naming it.
    let other = 1 - gpu;
    ctl(&w, &["arm", "lose-gpu", &other.to_string()]);
    let e3 = w.job_env(jobs(3), 1, Some("1g.18gb"));
    let out = prolog(&w, &e3);
    assert!(!out.status.success(), "prolog with no GPU: {}", text(&out));
    assert!(stderr(&out).contains("fell off the bus"), "{}", text(&out));
    // Back (after a reboot, on a real node): the kept journal is torn down.
    ctl(&w, &["restore-gpu", "0"]);
    ctl(&w, &["restore-gpu", "1"]);
    let out = epilog(&w, &e1);
    assert!(
        out.status.success(),
        "epilog after the GPU is back: {}",
        text(&out)
    );
    w.assert_nothing_left("after the lost GPU came back");
}

/// Driver 535 calls the A100-80GB's 3g.40gb "3g.39gb" (NVIDIA/mig-parted issue 31; Slurm's
/// AutoDetect=nvml then lost the configured GRES type): `tenancyctl check` and `doctor` say
/// which configured name the driver does not report, and what it reports instead.
#[test]
fn renamed_profile_is_reported_by_check() {
    let Some(w) = world(1) else { return };
    set_fixture(
        &w,
        "driver_version = \"535.129.03\"",
        &["model = \"A100-80GB\""],
    );
    edit_config(
        &w,
        "mig_profiles = [\"1g.18gb\", \"3g.71gb\"]",
        "mig_profiles = [\"1g.10gb\", \"3g.40gb\"]",
    );
    let ctl_bin = built_or_skip("tenancyctl").unwrap();
    let tenancyctl = |args: &[&str]| {
        Command::new(&ctl_bin)
            .arg("--config")
            .arg(&w.config_path)
            .args(args)
            .env_remove("NVML_SHIM_FIXTURE")
            .output()
            .unwrap()
    };
    let out = tenancyctl(&["check"]);
    assert!(out.status.success(), "check: {}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let warned: Vec<&str> = said.lines().filter(|l| l.starts_with("warning:")).collect();
    assert_eq!(warned.len(), 1, "{said}");
    assert!(
        warned[0].contains("3g.40gb")
            && warned[0].contains("\"3g.39gb\"")
            && warned[0].contains("535.129.03")
            && warned[0].contains("tier internal"),
        "{said}"
    );
    let out = tenancyctl(&["doctor", "--format", "json"]);
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("doctor --format json: {e}: {}", text(&out)));
    let named: Vec<&Value> = rows
        .iter()
        .filter(|r| r["check"] == "nvml.profiles")
        .collect();
    assert_eq!(named.len(), 1, "{rows:?}");
    assert_eq!(named[0]["severity"], "warn");
    let m = named[0]["message"].as_str().unwrap();
    assert!(m.contains("3g.40gb") && m.contains("\"3g.39gb\""), "{m}");
    // With the driver's names as the table's: nothing to say.
    set_fixture(
        &w,
        "driver_version = \"570.124.06\"",
        &["model = \"A100-80GB\""],
    );
    let out = tenancyctl(&["check"]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!said.contains("warning:"), "{said}");
    assert!(
        said.contains("MIG profile names: as the driver 570.124.06"),
        "{said}"
    );
}

/// The real driver makes no node in /dev for a new instance (nvidia-modprobe makes it on first
/// use, which inside the job's allowlist fails: no mknod): the prolog makes the job's two
/// capability nodes, as root, in the configured folder, on the nvidia-caps major with the
/// minors of mig-minors, mode 0444, and replaces whatever stood in their place.
#[test]
fn prolog_makes_the_caps_nodes() {
    let Some(w) = world(1) else { return };
    let caps = w.root.join("dev/nvidia-caps");
    let listed = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        listed(&caps),
        ["nvidia-cap1", "nvidia-cap2"],
        "the driver's own"
    );
    // The driver's tables say where each capability's node is.
    let devices = std::fs::read_to_string(w.root.join("proc-devices")).unwrap();
    let major: u64 = devices
        .lines()
        .find(|l| l.ends_with(" nvidia-caps"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    let minors = std::fs::read_to_string(w.root.join("mig-minors")).unwrap();
    let minor_of = |name: &str| -> u64 {
        minors
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("mig-minors has no {name}"))
            .parse()
            .unwrap()
    };
    // Something else where the GI's node goes (the first 1g GI: GPU 0, GI 7 at placement 0).
    let gi_minor = minor_of("gpu0/gi7/access");
    std::fs::write(caps.join(format!("nvidia-cap{gi_minor}")), "stale").unwrap();
    let job = jobs(1);
    let env = w.job_env(job, 0, Some("1g.18gb"));
    prolog_ok(&w, &env);
    let m = mig_made(&w, job);
    assert_eq!(
        (m["gi_id"].as_u64(), m["ci_id"].as_u64()),
        (Some(7), Some(0))
    );
    let ci_minor = minor_of("gpu0/gi7/ci0/access");
    for minor in [gi_minor, ci_minor] {
        let path = caps.join(format!("nvidia-cap{minor}"));
        let md = std::fs::symlink_metadata(&path).unwrap();
        assert!(md.file_type().is_char_device(), "{}", path.display());
        assert_eq!(
            (libc::major(md.rdev()) as u64, libc::minor(md.rdev()) as u64),
            (major, minor),
            "{}",
            path.display()
        );
        assert_eq!(md.mode() & 0o7777, 0o444, "{}", path.display());
        assert_eq!((md.uid(), md.gid()), (0, 0), "{}", path.display());
    }
    assert_eq!(
        std::fs::metadata(&caps).unwrap().permissions().mode() & 0o7777,
        0o755
    );
    // The job's allowlist lets it open them (the driver would answer ENXIO here: no driver
    // behind the stand-in's nodes), and no one else's: a process in the job's cgroup.
    let opened = open_in_cgroup(
        &w.cgroup(0, job),
        &caps.join(format!("nvidia-cap{ci_minor}")),
    );
    assert_eq!(opened, libc::ENXIO, "the job's own capability node");
    epilog_ok(&w, &env);
    // The nodes stay, as nvidia-modprobe's do: the allowlist keeps other jobs out.
    assert!(caps.join(format!("nvidia-cap{ci_minor}")).exists());
    w.assert_nothing_left("after the job");
}

/// The errno of an open of `path` by a child put in `cgroup` first (0: it opened).
fn open_in_cgroup(cgroup: &Path, path: &Path) -> i32 {
    let procs = cgroup.join("cgroup.procs");
    let script = format!(
        "echo $$ > {} && exec python3 -c 'import os,sys\ntry:\n    os.close(os.open(sys.argv[1], os.O_RDONLY))\n    print(0)\nexcept OSError as e:\n    print(e.errno)' {}",
        procs.display(),
        path.display()
    );
    let out = Command::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// A driver call that hangs (here: every GPU instance create waits two minutes) fails the
/// prolog closed within the NVML budget (`node.nvml_timeout_ms`), with a rollback record; the
/// hung call may still make its instance, so its intent stays in the journal, and the epilog
/// (a fresh process) tears down whatever is there.
#[test]
fn hung_nvml_call_fails_the_prolog_in_time() {
    let Some(w) = world(1) else { return };
    edit_config(&w, "[node]\n", "[node]\nnvml_timeout_ms = 1500\n");
    ctl(&w, &["arm", "slow-create", "120000"]);
    let job = jobs(1);
    let env = w.job_env(job, 0, Some("1g.18gb"));
    let started = Instant::now();
    let out = prolog(&w, &env);
    let took = started.elapsed();
    assert!(
        !out.status.success(),
        "prolog with a hung create: {}",
        text(&out)
    );
    assert!(
        took < Duration::from_secs(60),
        "the prolog gave up in {took:?}, not after the 120 s call"
    );
    let err = stderr(&out);
    assert!(
        err.contains("did not answer the call to create the slice within 1500 ms"),
        "{err}"
    );
    let last = records_of(&w, job).pop().unwrap();
    assert_eq!(
        (last.event, last.outcome),
        (Event::Rollback, Outcome::Failure)
    );
    assert!(
        last.reason
            .unwrap_or_default()
            .contains("rollback incomplete"),
        "the record says what is left"
    );
    assert_eq!(
        mig_state(&w, job),
        "intended",
        "the intent is kept for teardown"
    );
    // The driver recovers; the epilog finds nothing made, or removes what was.
    ctl(&w, &["disarm"]);
    epilog_ok(&w, &env);
    w.assert_nothing_left("after the hung prolog's epilog");
    assert!(w.chain_is_valid());
}
