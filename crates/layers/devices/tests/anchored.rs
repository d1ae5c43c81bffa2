//! The device allowlist anchored in a Slurm-like cgroup/v2 tree (`Target::Anchored`): Slurm's
//! own programs at job and step level (`BPF_F_ALLOW_OVERRIDE`) and task level (flags 0) stay
//! in force, and the node program on slurmstepd's scope (MULTI) adds each job's allowlist on
//! top, found by the job's ancestor cgroup. Root only; on the cgroup2 mount of the machine.

mod common;
use common::*;
use std::path::PathBuf;
use tenancy_devices::bpf::sys;
use tenancy_devices::job::{self, SlurmScope, Target, KEEPER};
use tenancy_devices::v2;
use tenancy_devices::{anchored, CgroupLayout, DevicePolicy, JobDeviceParams, SliceRef};

fn v2_root() -> PathBuf {
    CgroupLayout::detect()
        .unwrap()
        .v2_root
        .expect("cgroup2 mounted")
}

/// Slurm's own program, like its cgroup/v2 plugin's with ConstrainDevices: here it denies
/// /dev/zero (an unallocated GRES file stands for it) and accepts everything else.
fn slurms_program() -> DevicePolicy {
    DevicePolicy {
        allow: vec![],
        deny_majors: vec![],
        deny_devices: vec!["c 1:5 rwm".parse().unwrap()],
    }
}

/// Slurm's tree of one job: `job_<id>` (OVERRIDE), `step_0` (OVERRIDE), `step_0/user/task_0`
/// (flags 0), as its cgroup/v2 plugin makes it; returns the task folder.
fn slurm_job(scope: &SlurmScope, job: u64) -> PathBuf {
    let j = scope.job_dir(job);
    std::fs::create_dir_all(&j).unwrap();
    v2::apply_with_flags(&j, &slurms_program(), sys::F_ALLOW_OVERRIDE).unwrap();
    let step = j.join("step_0");
    std::fs::create_dir_all(step.join("user/task_0")).unwrap();
    v2::apply_with_flags(&step, &slurms_program(), sys::F_ALLOW_OVERRIDE).unwrap();
    let task = step.join("user/task_0");
    v2::apply_with_flags(&task, &slurms_program(), 0).unwrap();
    task
}

fn params(fx: &Fixture, job: u64, slices: &[SliceRef], target: Target) -> JobDeviceParams {
    JobDeviceParams {
        job_id: job,
        tenant: "lab".into(),
        slices: slices.to_vec(),
        extra: vec!["c 1:* rwm".parse().unwrap()],
        driver: fx.driver(),
        target,
    }
}

#[test]
fn anchored_allowlist_holds_under_slurms_programs() {
    if !requires_root("anchored_allowlist_holds_under_slurms_programs") {
        return;
    }
    let fx = Fixture::new();
    let mount = v2_root();
    let tree = CgTree::new(mount.to_str().unwrap(), "anchored");
    let scope_dir = tree.mkdir("system.slice/t_slurmstepd.scope");
    let scope = scope_at(&mount, &scope_dir);
    let target = Target::Anchored {
        scope: scope.clone(),
    };
    // The prolog runs first and makes Slurm's job folder; Slurm attaches its programs later.
    let a = job::setup(&params(&fx, 5, &[SLICE_A], target.clone())).unwrap();
    let b = job::setup(&params(&fx, 6, &[SLICE_B], target.clone())).unwrap();
    assert_eq!(a.cgroup_dir, scope.job_dir(5));
    assert!(!a.owned);
    let a_task = slurm_job(&scope, 5);
    let b_task = slurm_job(&scope, 6);
    // One node program on the scope, MULTI; Slurm's stay where Slurm put them.
    let (ids, flags) = v2::query(&scope_dir).unwrap();
    assert_eq!((ids.len(), flags), (1, sys::F_ALLOW_MULTI));
    assert_eq!(v2::query(&a_task).unwrap().1, 0);

    let mut a_cases = job_a_cases();
    a_cases.retain(|(n, _)| *n != "/dev/zero");
    a_cases.push(("/dev/zero", Denied)); // Slurm's own program still applies
    check(&fx, &a_task, &a_cases);
    check(&fx, &b_task, &job_b_cases());
    // slurmstepd's own folder of the step (no task program): ours and Slurm's step program.
    let stepd = tree.mkdir("system.slice/t_slurmstepd.scope/job_5/step_0/slurm");
    check(&fx, &stepd, &job_a_cases()[..6]);
    check(&fx, &stepd, &[("nvidia-caps/nvidia-cap21", Denied)]);
    // A user's process under the scope in a folder of no job the map holds (a job folder
    // Slurm made again with a new id, a job this node did not set up) gets no GPU, capability
    // or RDMA node; the rest still opens. Root's pass: Slurm's own folders there (`system`,
    // where slurmstepd waits, `slurmd`, where a slurmd not started by systemd runs its
    // prologs) hold only root's processes.
    let other = tree.mkdir("system.slice/t_slurmstepd.scope/job_99/step_0");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(fx.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    check_as(&fx, &other, Some(NOBODY), &no_job_cases());
    let slurmd = tree.mkdir("system.slice/t_slurmstepd.scope/slurmd");
    check(&fx, &slurmd, &unrestricted_cases());
    check(&fx, &other, &unrestricted_cases());
    // A job's own program holds whoever opens (a user's task as root's).
    check_as(&fx, &b_task, Some(NOBODY), &job_b_cases());
    // The job folder's keeper: Slurm's removal of the folder when the job's last step ends
    // fails (a cgroup with a child), so the folder, and the id the job is keyed on, stay.
    let keeper = a.cgroup_dir.join(KEEPER);
    assert!(keeper.is_dir(), "no keeper in {}", a.cgroup_dir.display());
    let busy = std::fs::remove_dir(&a.cgroup_dir).unwrap_err();
    assert_eq!(busy.raw_os_error(), Some(libc::EBUSY), "{busy}");

    // Teardown empties A's slot and entry; B keeps its allowlist; twice is fine.
    let held = anchored::jobs(&scope_dir).unwrap();
    assert_eq!(held.len(), 2);
    job::teardown(&a).unwrap();
    assert_eq!(
        anchored::jobs(&scope_dir).unwrap(),
        vec![b.anchored.as_ref().unwrap().cgroup_id]
    );
    job::teardown(&a).unwrap();
    check(&fx, &b_task, &job_b_cases());
    // A re-run of B's prolog keeps its slot.
    let b2 = job::setup(&params(&fx, 6, &[SLICE_B], target.clone())).unwrap();
    assert_eq!(
        b2.anchored.as_ref().unwrap().slot,
        b.anchored.as_ref().unwrap().slot
    );
    check(&fx, &b_task, &job_b_cases());
    job::teardown(&b2).unwrap();
    assert!(anchored::jobs(&scope_dir).unwrap().is_empty());
    // A job whose epilog never ran: once Slurm removed its folder, its entry is collected
    // (a prolog does so when every slot is held); a live job's entry is kept.
    let c = job::setup(&params(&fx, 7, &[SLICE_A], target.clone())).unwrap();
    let d = job::setup(&params(&fx, 8, &[SLICE_B], target.clone())).unwrap();
    std::fs::remove_dir(c.cgroup_dir.join(KEEPER)).unwrap();
    std::fs::remove_dir(&c.cgroup_dir).unwrap();
    assert_eq!(
        anchored::collect_stale(&scope_dir).unwrap(),
        vec![c.anchored.as_ref().unwrap().cgroup_id]
    );
    assert_eq!(
        anchored::jobs(&scope_dir).unwrap(),
        vec![d.anchored.as_ref().unwrap().cgroup_id]
    );
    // Teardown removes the keeper and the folder once Slurm's own are gone.
    job::teardown(&d).unwrap();
    assert!(!d.cgroup_dir.exists(), "{} left", d.cgroup_dir.display());
    let pin = format!(
        "{}/tenancy_progs_{}",
        anchored::BPFFS,
        tenancy_cgroup_id(&scope_dir)
    );
    std::fs::remove_file(&pin).unwrap_or_else(|e| panic!("the program array's pin {pin}: {e}"));
}

/// An unprivileged uid for a task (nobody).
const NOBODY: u32 = 65534;

fn tenancy_cgroup_id(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir).unwrap().ino()
}

/// Release 2's node program (it let every folder of no job pass), as it was attached.
fn release2_node_program(
    level: u32,
    jobs_fd: i32,
    progs_fd: i32,
) -> Vec<tenancy_devices::bpf::Insn> {
    use tenancy_devices::bpf::{op, Insn};
    let i = |code: u8, dst: u8, src: u8, off: i16, imm: i32| Insn {
        code,
        regs: (src << 4) | (dst & 0xf),
        off,
        imm,
    };
    vec![
        i(op::MOV64_REG, 6, 1, 0, 0),
        i(op::MOV64_IMM, 1, 0, 0, level as i32),
        i(0x85, 0, 0, 0, 123),
        i(0x7b, 10, 0, -8, 0),
        i(op::MOV64_REG, 2, 10, 0, 0),
        i(0x07, 2, 0, 0, -8),
        i(0x18, 1, 1, 0, jobs_fd),
        i(0, 0, 0, 0, 0),
        i(0x85, 0, 0, 0, 1),
        i(op::JEQ_IMM, 0, 0, 7, 0),
        i(op::LDXW, 3, 0, 0, 0),
        i(op::MOV64_REG, 1, 6, 0, 0),
        i(0x18, 2, 1, 0, progs_fd),
        i(0, 0, 0, 0, 0),
        i(0x85, 0, 0, 0, 12),
        i(op::MOV64_IMM, 0, 0, 0, 0),
        i(op::EXIT, 0, 0, 0, 0),
        i(op::MOV64_IMM, 0, 0, 0, 1),
        i(op::EXIT, 0, 0, 0, 0),
    ]
}

/// A node whose scope still has release 2's node program (upgraded while it ran jobs): the
/// next prolog attaches the current one on the same maps and detaches the old, so the job the
/// old one held keeps its allowlist, the new job gets its own, and a user's process in a
/// folder of no job is denied the NVIDIA nodes from then on.
#[test]
fn an_old_node_program_is_replaced_on_its_maps() {
    if !requires_root("an_old_node_program_is_replaced_on_its_maps") {
        return;
    }
    use std::os::fd::{AsFd, AsRawFd};
    let fx = Fixture::new();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(fx.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mount = v2_root();
    let tree = CgTree::new(mount.to_str().unwrap(), "upgrade");
    let scope_dir = tree.mkdir("system.slice/u_slurmstepd.scope");
    let scope = scope_at(&mount, &scope_dir);
    // Release 2's prolog set job 6 up: its maps, its program in slot 0, its node program.
    let jobs = sys::map_create(sys::MAP_TYPE_HASH, 8, 4, anchored::SLOTS, "tenancy_jobs").unwrap();
    let progs = sys::map_create(
        sys::MAP_TYPE_PROG_ARRAY,
        4,
        4,
        anchored::SLOTS,
        "tenancy_progs",
    )
    .unwrap();
    let old = sys::prog_load_named(
        &release2_node_program(scope.job_level(), jobs.as_raw_fd(), progs.as_raw_fd()),
        "tenancy_node",
    )
    .unwrap_or_else(|(e, log)| panic!("load release 2's node program: {e}\n{log}"));
    let scope_fd = std::fs::File::open(&scope_dir).unwrap();
    sys::prog_attach(scope_fd.as_fd(), old.as_fd(), sys::F_ALLOW_MULTI).unwrap();
    let (_, b_id) = scope.ensure_job_dir(6).unwrap();
    let drv = tenancy_devices::DriverInfo::load_for(&fx.driver(), &[SLICE_B]).unwrap();
    let b_policy = DevicePolicy::for_job(&drv, &[SLICE_B], &[]).unwrap();
    let b_prog = sys::prog_load(&tenancy_devices::bpf::generate(&b_policy)).unwrap();
    let fd = (b_prog.as_raw_fd() as u32).to_ne_bytes();
    sys::map_update(progs.as_fd(), &0u32.to_ne_bytes(), &fd, sys::UPDATE_ANY).unwrap();
    sys::map_update(
        jobs.as_fd(),
        &b_id.to_ne_bytes(),
        &0u32.to_ne_bytes(),
        sys::UPDATE_ANY,
    )
    .unwrap();
    let other = tree.mkdir("system.slice/u_slurmstepd.scope/job_99/step_0");
    check_as(&fx, &other, Some(NOBODY), &unrestricted_cases());

    // The new build's prolog of job 5.
    let target = Target::Anchored {
        scope: scope.clone(),
    };
    let a = job::setup(&params(&fx, 5, &[SLICE_A], target)).unwrap();
    let (ids, flags) = v2::query(&scope_dir).unwrap();
    assert_eq!(flags, sys::F_ALLOW_MULTI);
    let names: Vec<String> = ids
        .iter()
        .map(|id| {
            sys::prog_info(sys::prog_get_fd_by_id(*id).unwrap().as_fd())
                .unwrap()
                .1
        })
        .collect();
    assert_eq!(names, vec![anchored::NODE_PROG_NAME.to_string()]);
    let b_task = tree.mkdir("system.slice/u_slurmstepd.scope/job_6/step_0/user/task_0");
    check(&fx, &b_task, &job_b_cases());
    let a_task = tree.mkdir("system.slice/u_slurmstepd.scope/job_5/step_0/user/task_0");
    check(&fx, &a_task, &job_a_cases());
    check_as(&fx, &other, Some(NOBODY), &no_job_cases());
    let mut held = anchored::jobs(&scope_dir).unwrap();
    held.sort_unstable();
    let mut want = vec![b_id, a.anchored.as_ref().unwrap().cgroup_id];
    want.sort_unstable();
    assert_eq!(held, want);
    job::teardown(&a).unwrap();
}

/// Slurm's slurmstepd scope at `scope_dir`, a folder of the cgroup2 `mount`.
fn scope_at(mount: &std::path::Path, scope_dir: &std::path::Path) -> SlurmScope {
    SlurmScope {
        v2_mount: mount.to_path_buf(),
        rel: scope_dir
            .strip_prefix(mount)
            .unwrap()
            .to_str()
            .unwrap()
            .to_string(),
    }
}
