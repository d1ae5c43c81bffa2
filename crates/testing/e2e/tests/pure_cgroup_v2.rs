//! The product on a pure cgroup v2 node, where Slurm's cgroup/v2 plugin owns the jobs' cgroups
//! (`ConstrainDevices=yes`, `ConstrainRAMSpace=yes`): a user-mode-linux kernel booted on the
//! Slurm 24.11 root (src/uml_node.rs; the shell it runs in scripts/uml/ and scripts/pure_v2/),
//! with the SPANK plugin built for 24.11,
//! tenancy-prolog/-epilog, the NVML stand-in and the firewall installed as on a real node.
//! Needs root; skips loudly otherwise. The kernel and root are made when missing (minutes, once;
//! cached in /var/cache/slurm-tenancy); a failure to make them fails the test.

use tenancy_e2e::{scenario, Options, PureV2Node};

<<<<<<< HEAD
// On the pure v2 node, each task of a job (the batch task and a step's) stays under the
// product's device program and firewall: globex's tasks get EPERM opening acme's MIG device
// nodes, which acme's own step opens past the allowlist, and cannot connect to acme's port,
// which acme's own step reaches.
scenario!(
    pure_cgroup_v2_node_isolates_every_task,
    Options::default(),
    |node: &mut PureV2Node| {
        let run = node.run(include_str!("../scripts/pure_v2/isolates_every_task.sh"));
        assert_eq!(run.get("a_state"), "COMPLETED", "{}", run.log);
        assert_eq!(run.get("g_state"), "COMPLETED", "{}", run.log);
        let own = run.get("own_connect");
        assert!(own.starts_with("ok"), "acme's own step: {own}\n{}", run.log);
        for k in ["batch_attack_connect", "step_attack_connect"] {
            let r = run.get(k);
            assert!(
                !r.is_empty() && !r.starts_with("ok"),
                "{k}: globex reached acme's port: {r}"
            );
        }
        let caps: Vec<(&String, &String)> = run
            .results
            .iter()
            .filter(|(k, _)| k.starts_with("cap_"))
            .collect();
        assert!(!caps.is_empty(), "no nvidia-caps nodes: {}", run.log);
        // ENXIO: the open passed the device program (no driver behind the node); EPERM: denied
        // by it. EACCES (a root-only node) comes from the file mode, before the device check.
        let mut acme_only = 0;
        for (cap, v) in &caps {
            let (own, other) = v.split_once('/').unwrap_or((v.as_str(), ""));
            if own == "ENXIO" {
                assert_eq!(
                    other, "EPERM",
                    "{cap}: globex's step opened a node acme's job may open: {:?}",
                    run.results
                );
                acme_only += 1;
            }
        }
=======
static SERIAL: Mutex<()> = Mutex::new(());

/// The folder of the product's state on the node (its tmpfs).
const T: &str = "/tmp/tenancy";

/// Boots the node with the product installed and runs `scenario` (shell; `as USER CMD...` runs a
/// client as a user, `$P` is the probe, `$J` a folder every user may write, results go to
/// `$RES` as key=value lines).
fn node_with_product(t: &Tenants, scenario: &str) -> NodeRun {
    let paths = StackPaths::under(std::path::Path::new(T));
    node_with(&tenancy_toml(&paths, t), "", scenario)
}

/// [`node_with_product`] with the product's config `config` and extra slurm.conf lines.
fn node_with(config: &str, slurm_conf_extra: &str, scenario: &str) -> NodeRun {
    let root = SlurmRoot::make("24.11").unwrap_or_else(|e| panic!("Slurm 24.11 root: {e:#}"));
    let kernel = kernel().unwrap_or_else(|e| panic!("UML kernel: {e:#}"));
    let paths = StackPaths::under(std::path::Path::new(T));
    let files: Vec<(&str, PathBuf)> = vec![
        ("tenancy-prolog", artifact("tenancy-prolog").unwrap()),
        ("tenancy-epilog", artifact("tenancy-epilog").unwrap()),
        (
            "tenancy-prolog-dynamic",
            artifact("tenancy-prolog-dynamic").unwrap(),
        ),
        ("tenancyctl", artifact("tenancyctl").unwrap()),
        ("tenancy-e2e-probe", artifact("tenancy-e2e-probe").unwrap()),
        ("nvml-shim-ctl", artifact("nvml-shim-ctl").unwrap()),
        ("libnvidia_ml.so", artifact("libnvidia_ml.so").unwrap()),
        (
            "libspank_tenancy.so",
            root.plugin("libspank_tenancy.so").unwrap(),
        ),
    ];
    let setup = format!(
        r#"set -e
T={T}
mkdir -p $T/state $T/audit $T/scratch $T/lib $T/nvml $T/dev $T/bin
chmod 755 $T $T/scratch $T/lib $T/nvml $T/dev
head -c 32 /dev/urandom >$T/audit/anchor.key
chmod 600 $T/audit/anchor.key
cp /tenancy-uml/bin/libnvidia_ml.so $T/lib/libnvidia-ml.so.1
cat >$T/nvml/fixture.toml <<'EOF'
{fixture}
EOF
cat >/tmp/slurm/tenancy.toml <<'EOF'
{config}
EOF
chmod 644 /tmp/slurm/tenancy.toml
echo "required /tenancy-uml/bin/libspank_tenancy.so config=/tmp/slurm/tenancy.toml" >/tmp/slurm/plugstack.conf
NVML_SHIM_FIXTURE=$T/nvml/fixture.toml /tenancy-uml/bin/nvml-shim-ctl layout
/tenancy-uml/bin/tenancyctl --config /tmp/slurm/tenancy.toml firewall apply
"#,
        fixture = nvml_fixture(&paths),
    );
    let scenario = format!(
        r#"export PATH=/usr/sbin:/usr/bin:/sbin:/bin
RES=/tenancy-uml/out/results
P=/tenancy-uml/bin/tenancy-e2e-probe
J=/tmp/slurm/jobs
as() {{ u=$1; shift; runuser -u "$u" -- env SLURM_CONF=$SLURM_CONF "$@"; }}
job_state() {{ scontrol show job "$1" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }}
wait_done() {{
  i=0
  while :; do
    case $(job_state "$1") in
      COMPLETED|FAILED|CANCELLED|TIMEOUT|OUT_OF_MEMORY|NODE_FAIL) return ;;
    esac
    i=$((i + 1)); [ $i -gt 240 ] && return; sleep 0.5
  done
}}
wait_line() {{ i=0; until grep -q "^$2" "$1" 2>/dev/null; do i=$((i + 1)); [ $i -gt 240 ] && return; sleep 0.5; done; }}
{scenario}
"#
    );
    let conf = format!(
        "Prolog=/tenancy-uml/bin/tenancy-prolog\nEpilog=/tenancy-uml/bin/tenancy-epilog\n\
         PlugStackConfig=/tmp/slurm/plugstack.conf\n{slurm_conf_extra}"
    );
    let run = boot(
        &root,
        &kernel,
        &files,
        &conf,
        &setup,
        &scenario,
        Duration::from_secs(900),
    )
    .unwrap_or_else(|e| panic!("UML node: {e:#}"));
    eprintln!("UML node up and down in {:.0} s", run.boot_seconds);
    assert_eq!(run.get("setup_rc"), "0", "{}", run.log);
    assert_eq!(run.get("node_state"), "idle", "{}", run.log);
    run
}

/// On the pure v2 node, each task of a job (the batch task and a step's) stays under the
/// product's device program and firewall: globex's tasks get EPERM opening acme's MIG device
/// nodes, which acme's own step opens past the allowlist, and cannot connect to acme's port,
/// which acme's own step reaches.
#[test]
fn pure_cgroup_v2_node_isolates_every_task() {
    if !require_root("pure_cgroup_v2_node_isolates_every_task") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut users = Users::new();
    let t = Tenants::create(&mut users).expect("users");
    let (a_user, g_user) = (&t.acme1.name, &t.globex1.name);
    let run = node_with_product(
        &t,
        &format!(
            r#"R=$J/release; PORT=7777
a=$(as {a_user} sbatch --tenant=acme --mig=1g.18gb -o $J/a.out --wrap "$P env; $P write \$TMPDIR/secret s3cret; $P serve $PORT $R")
a=${{a##* }}
wait_line $J/a.out listening=
g=$(as {g_user} sbatch --tenant=globex --mig=3g.71gb -o $J/g.out --wrap "$P connect 127.0.0.1:$PORT 2000; $P envwait $R")
g=${{g##* }}
wait_line $J/g.out uid=
echo "a_job=$a" >>$RES; echo "g_job=$g" >>$RES
echo "batch_attack_connect=$(sed -n 's/^connect=//p' $J/g.out | head -1)" >>$RES
step() {{ u=$1; j=$2; shift 2; as "$u" srun --jobid=$j --overlap -n1 -N1 $P "$@"; }}
echo "own_connect=$(step {a_user} $a connect 127.0.0.1:$PORT 2000 | sed -n 's/^connect=//p')" >>$RES
echo "step_attack_connect=$(step {g_user} $g connect 127.0.0.1:$PORT 2000 | sed -n 's/^connect=//p')" >>$RES
for c in {T}/dev/nvidia-caps/*; do
  own=$(step {a_user} $a open $c | sed -n 's/^open=//p')
  other=$(step {g_user} $g open $c | sed -n 's/^open=//p')
  echo "cap_$(basename $c)=$own/$other" >>$RES
done
grep '^cgroup=' $J/a.out | head -3 | sed 's/^/a_batch_/' >>$RES
# Which instance each cap minor is (the stand-in's mig-minors), and the jobs' slices.
sed 's/^\([^ ]*\) \(.*\)/minor_\2=\1/' {T}/nvml/mig-minors >>$RES
grep -h '^CUDA_VISIBLE_DEVICES=' $J/a.out | sed 's/^/a_/' >>$RES
grep -h '^CUDA_VISIBLE_DEVICES=' $J/g.out | sed 's/^/g_/' >>$RES
# Scratch: acme's private folder, read by acme's own step and attacked by globex's.
A_TMP=$(sed -n 's/^TMPDIR=//p' $J/a.out | head -1)
echo "own_scratch=$(step {a_user} $a read $A_TMP/secret | sed -n 's/^read=//p')" >>$RES
echo "scratch_attack=$(step {g_user} $g read $A_TMP/secret | sed -n 's/^read=//p')" >>$RES
# A task epilog (run by slurmstepd after the task, outside the task hook) attacks too.
cat >$J/attack.sh <<ATTACK
#!/bin/sh
{{
  $P connect 127.0.0.1:$PORT 2000
  for c in {T}/dev/nvidia-caps/*; do echo "cap \$(basename \$c) \$($P open \$c)"; done
  cat /proc/self/cgroup
}} >$J/epi.out 2>&1
ATTACK
chmod 755 $J/attack.sh
as {g_user} srun --jobid=$g --overlap -n1 -N1 --task-epilog=$J/attack.sh true
wait_line $J/epi.out 0::
echo "epilog_connect=$(sed -n 's/^connect=//p' $J/epi.out)" >>$RES
grep '^cap ' $J/epi.out | while read _ n v; do echo "epi_$n=${{v#open=}}" >>$RES; done
echo "epilog_cgroup=$(grep '^0::' $J/epi.out)" >>$RES
touch $R
wait_done $a; wait_done $g
echo "a_state=$(job_state $a)" >>$RES
echo "g_state=$(job_state $g)" >>$RES
"#
        ),
    );
    assert_eq!(run.get("a_state"), "COMPLETED", "{}", run.log);
    assert_eq!(run.get("g_state"), "COMPLETED", "{}", run.log);
    let own = run.get("own_connect");
    assert!(own.starts_with("ok"), "acme's own step: {own}\n{}", run.log);
    for k in ["batch_attack_connect", "step_attack_connect"] {
        let r = run.get(k);
>>>>>>> issue-40-v2
        assert!(
            acme_only > 0,
            "acme's step opened none of its caps: {caps:?}"
        );
        // Scratch: acme's own step reads its file, globex's cannot.
        let own = run.get("own_scratch");
        assert!(
            own.starts_with("ok s3cret"),
            "acme's own scratch: {own}\n{}",
            run.log
        );
        assert_eq!(run.get("scratch_attack"), "EACCES", "{}", run.log);
        // A task epilog of globex's, which slurmstepd runs after the task exited: held by the same
        // firewall and device program, in globex's job cgroup.
        let epi = run.get("epilog_connect");
        assert!(
            !epi.is_empty() && !epi.starts_with("ok"),
            "globex's task epilog reached acme's port: {epi}\n{}",
            run.log
        );
        for (cap, v) in &caps {
            let (own, _) = v.split_once('/').unwrap_or((v.as_str(), ""));
            if own == "ENXIO" {
                let name = cap.trim_start_matches("cap_");
                assert_eq!(
                    run.get(&format!("epi_{name}")),
                    "EPERM",
                    "globex's task epilog opened acme's {name}"
                );
            }
        }
        let g_job = run.get("g_job");
        let epi_cg = run.get("epilog_cgroup");
        assert!(
            epi_cg.contains(&format!("slurmstepd.scope/job_{g_job}/")),
            "globex's task epilog ran outside its job cgroup: {epi_cg}"
        );
        // The isolation is anchored in Slurm's own job cgroup: the batch task stays where Slurm's
        // cgroup/v2 plugin put it (its memory and CPU limits), never in the product's tree.
        let batch = run.get("a_batch_cgroup");
        let a_job = run.get("a_job");
        assert!(
            batch.contains(&format!("slurmstepd.scope/job_{a_job}/step_batch/")),
            "acme's batch task is not in Slurm's job cgroup: {batch}\n{}",
            run.log
        );
    }
);

// On the pure v2 node with the product installed, Slurm's own memory limit still applies to a
// job's tasks: a batch job with `--mem=64` allocating 200 MB (tail holding a line of zeros) is
// killed by the kernel (as without the product), while the same allocation under `--mem=480`
// completes; both tasks stay in Slurm's job cgroup.
scenario!(
    pure_cgroup_v2_node_keeps_slurms_memory_limit,
    Options::default(),
    |node: &mut PureV2Node| {
        let run = node.run(include_str!("../scripts/pure_v2/keeps_memory_limit.sh"));
        assert_eq!(run.get("survived_480"), "1", "control job: {}", run.log);
        assert_eq!(run.get("state_480"), "COMPLETED", "{}", run.log);
        let cgroup = run.get("cgroup_64");
        assert_eq!(
        run.get("survived_64"),
        "0",
        "a task with --mem=64 allocated 200 MB: Slurm's memory limit did not apply (its cgroup: \
         {cgroup})"
    );
<<<<<<< HEAD
        assert_eq!(run.get("state_64"), "OUT_OF_MEMORY", "{}", run.log);
        assert!(
            cgroup.contains("slurmstepd.scope/job_") && !cgroup.contains("/tenancy/"),
            "the task left Slurm's job cgroup: {cgroup}"
        );
    }
);
=======
    assert_eq!(run.get("state_64"), "OUT_OF_MEMORY", "{}", run.log);
    assert!(
        cgroup.contains("slurmstepd.scope/job_") && !cgroup.contains("/tenancy/"),
        "the task left Slurm's job cgroup: {cgroup}"
    );
}

// ---- the isolation follows Slurm's job folder for the job's whole life ----------------------

/// The product's config for the node, with the node's own address (192.0.2.10, where srun
/// runs on this node) among the infrastructure: slurmstepd's I/O connection to an srun run
/// from the node's shell is the user's and judged (issue 40, item 6: judged as the job's), and
/// the tests below are about the job folder, not about that connection.
fn config_for(t: &Tenants) -> String {
    let paths = StackPaths::under(std::path::Path::new(T));
    let text = tenancy_toml(&paths, t);
    let infra = "infrastructure = [\"127.0.0.1/32:1-65535/tcp\"]";
    assert!(text.contains(infra), "the stack's config changed: {text}");
    text.replace(
        infra,
        "infrastructure = [\"127.0.0.1/32:1-65535/tcp\", \"192.0.2.10/32:1-65535/tcp\"]",
    )
}

/// Shell for the scenarios below: acme's batch job with a MIG slice listening on `$PORT`
/// (`$a`), globex's allocation without a shell (`$g`, its job folder `$F`), and `probe USER
/// JOB KEY`, a new step of JOB as USER that tries acme's port and every MIG capability node and
/// says where it ran; its results go to `$RES` as `KEY_connect`, `KEY_cap_<node>`, `KEY_folder`
/// (the inode of the step's job folder) and `KEY_rc`.
fn two_jobs(a_user: &str, g_user: &str) -> String {
    r#"R=$J/release; PORT=7777
cat >$J/probe.sh <<PROBE
#!/bin/sh
$P connect 127.0.0.1:$PORT 2000
for c in @T@/dev/nvidia-caps/*; do echo "cap \$(basename \$c) \$($P open \$c)"; done
cg=\$(sed -n 's/^0:://p' /proc/self/cgroup)
echo "cgroup=\$cg"
stat -c 'folder=%i' /sys/fs/cgroup\$(echo \$cg | cut -d/ -f1-4)
PROBE
chmod 755 $J/probe.sh
probe() {
  as "$1" timeout 120 srun --jobid=$2 --overlap -n1 -N1 sh $J/probe.sh >$J/$3.out 2>&1
  echo "$3_rc=$?" >>$RES
  echo "$3_connect=$(sed -n 's/^connect=//p' $J/$3.out | head -1)" >>$RES
  echo "$3_folder=$(sed -n 's/^folder=//p' $J/$3.out | head -1)" >>$RES
  grep '^cap ' $J/$3.out | while read _ n v; do echo "$3_cap_$n=${v#open=}" >>$RES; done
  echo "$3_refused=$(grep -c 'made again' $J/$3.out)" >>$RES
}
folder() { stat -c %i $F 2>/dev/null || echo gone; }
# Until globex's steps have left (slurmstepd removes its folders, then tries the job's).
steps_gone() { i=0; while ls -d $F/step_* >/dev/null 2>&1; do i=$((i + 1)); [ $i -gt 120 ] && break; sleep 0.5; done; sleep 1; }
a=$(as @A@ sbatch --tenant=acme --mig=1g.18gb -o $J/a.out --wrap "$P serve $PORT $R")
a=${a##* }
wait_line $J/a.out listening=
g=$(as @G@ timeout 120 salloc --tenant=globex --no-shell 2>&1 | sed -n 's/.*Granted job allocation \([0-9]*\).*/\1/p')
F=$(echo /sys/fs/cgroup/system.slice/*slurmstepd.scope)/job_$g
echo "a_job=$a" >>$RES; echo "g_job=$g" >>$RES
echo "folder_prolog=$(folder)" >>$RES
echo "keeper_prolog=$([ -d $F/tenancy-keeper ] && echo yes || echo no)" >>$RES
probe @A@ $a own
"#
    .replace("@T@", T)
    .replace("@A@", a_user)
    .replace("@G@", g_user)
}

/// Ends both jobs of [`two_jobs`]; `folder_after_end` says whether the epilog removed globex's
/// job folder and its keeper.
const END_TWO_JOBS: &str = r#"scancel $g; touch $R
wait_done $a; wait_done $g
i=0; while [ -d $F ] && [ $i -lt 60 ]; do i=$((i + 1)); sleep 0.5; done
echo "folder_after_end=$(folder)" >>$RES
echo "a_state=$(job_state $a)" >>$RES
"#;

/// The acme capability nodes acme's own step opened (past the device program: ENXIO, no
/// driver behind them).
fn acme_caps(run: &NodeRun) -> Vec<String> {
    let caps: Vec<String> = run
        .results
        .iter()
        .filter(|(k, v)| k.starts_with("own_cap_") && *v == "ENXIO")
        .map(|(k, _)| k.trim_start_matches("own_cap_").to_string())
        .collect();
    assert!(
        !caps.is_empty(),
        "acme's own step opened none of its caps: {:?}\n{}",
        run.results,
        run.log
    );
    caps
}

/// Globex's step `key` ran and was held: dropped at acme's port, EPERM on acme's caps.
fn assert_held(run: &NodeRun, key: &str, caps: &[String], what: &str) {
    let connect = run.get(&format!("{key}_connect"));
    assert!(
        !connect.is_empty() && !connect.starts_with("ok"),
        "{what}: globex's step reached acme's port (connect={connect:?}) or did not run ({} \
         refused): {:?}\n{}",
        run.get(&format!("{key}_refused")),
        run.results,
        run.log
    );
    for cap in caps {
        assert_eq!(
            run.get(&format!("{key}_cap_{cap}")),
            "EPERM",
            "{what}: globex's step opened acme's {cap}"
        );
    }
}

/// Slurm's cgroup/v2 plugin removes a job's folder when its last running step ends and makes
/// it again, with a new cgroup id, for the next; the firewall elements and the device program
/// are keyed on the folder the prolog made. Without `PrologFlags=Contain` (every step is the
/// last running one), and with Contain once the user ended their own extern step, globex's
/// second step still runs in the job's folder of the prolog (the keeper holds it), is dropped
/// at acme's port and gets EPERM on acme's capability nodes; the epilog removes the folder. A
/// folder made again anyway (its keeper removed by root) is refused before user code.
#[test]
fn job_folder_recreated_by_slurm_keeps_the_isolation() {
    if !require_root("job_folder_recreated_by_slurm_keeps_the_isolation") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut users = Users::new();
    let t = Tenants::create(&mut users).expect("users");
    let (a_user, g_user) = (&t.acme1.name, &t.globex1.name);

    // Without Contain: no extern step, each step is the job's last running one.
    let run = node_with(
        &config_for(&t),
        "PrologFlags=Alloc",
        &format!(
            "{}probe {g_user} $g step1\nsteps_gone\necho \"folder_between=$(folder)\" >>$RES\n\
             probe {g_user} $g step2\n{END_TWO_JOBS}",
            two_jobs(a_user, g_user)
        ),
    );
    let caps = acme_caps(&run);
    let prolog = run.get("folder_prolog").to_string();
    assert_ne!(prolog, "gone", "the prolog made no job folder: {}", run.log);
    assert_eq!(run.get("keeper_prolog"), "yes", "{}", run.log);
    for key in ["step1", "step2"] {
        assert_held(&run, key, &caps, &format!("without Contain, {key}"));
        assert_eq!(
            run.get(&format!("{key}_folder")),
            prolog,
            "without Contain, {key} ran in a job folder the prolog did not make: {:?}",
            run.results
        );
    }
    assert_eq!(
        run.get("folder_between"),
        prolog,
        "Slurm removed the job folder after the first step"
    );
    assert_eq!(
        run.get("folder_after_end"),
        "gone",
        "the epilog left the folder"
    );
    assert_eq!(run.get("a_state"), "COMPLETED", "{}", run.log);

    // With Contain: the user ends their own extern step; then the keeper is removed by root
    // (nothing of the product does that) and Slurm makes the folder again: refused.
    let run = node_with(
        &config_for(&t),
        "",
        &format!(
            "{}probe {g_user} $g step1\n\
             as {g_user} scancel -s KILL $g.4294967292; echo \"kill_rc=$?\" >>$RES\n\
             i=0; while [ -d $F/step_extern ] && [ $i -lt 120 ]; do i=$((i + 1)); sleep 0.5; done\n\
             sleep 1; echo \"extern_left=$([ -d $F/step_extern ] && echo yes || echo no)\" >>$RES\n\
             echo \"folder_after_kill=$(folder)\" >>$RES\n\
             probe {g_user} $g step2\n\
             rmdir $F/tenancy-keeper; echo \"keeper_rm_rc=$?\" >>$RES\n\
             as {g_user} timeout 120 srun --jobid=$g -n1 -N1 true; steps_gone\n\
             echo \"folder_unkept=$(folder)\" >>$RES\n\
             probe {g_user} $g step4\n{END_TWO_JOBS}",
            two_jobs(a_user, g_user)
        ),
    );
    let caps = acme_caps(&run);
    let prolog = run.get("folder_prolog").to_string();
    assert_eq!(run.get("kill_rc"), "0", "{}", run.log);
    assert_eq!(
        run.get("extern_left"),
        "no",
        "the extern step did not end: {}",
        run.log
    );
    assert_eq!(run.get("folder_after_kill"), prolog, "{:?}", run.results);
    for key in ["step1", "step2"] {
        assert_held(&run, key, &caps, &format!("extern step killed, {key}"));
        assert_eq!(
            run.get(&format!("{key}_folder")),
            prolog,
            "{:?}",
            run.results
        );
    }
    // Without its keeper, Slurm removed the folder after the step and made it again for the
    // next: that step is refused before user code, never run unisolated.
    assert_eq!(run.get("keeper_rm_rc"), "0", "{}", run.log);
    assert_eq!(run.get("folder_unkept"), "gone", "{:?}", run.results);
    assert_ne!(run.get("step4_rc"), "0", "{:?}\n{}", run.results, run.log);
    assert_eq!(run.get("step4_connect"), "", "{:?}", run.results);
    assert_ne!(
        run.get("step4_refused"),
        "0",
        "{:?}\n{}",
        run.results,
        run.log
    );
    assert_eq!(run.get("a_state"), "COMPLETED", "{}", run.log);
}

/// `tenancyctl firewall apply` while jobs run (README: after every config change) replaces the
/// table; on this pure v2 node its jobs maps hold one pair of elements per running job, which
/// the new table keeps (the same transaction): globex's next step is still dropped at acme's
/// port, and acme's own still reaches it.
#[test]
fn firewall_apply_keeps_running_jobs_isolated() {
    if !require_root("firewall_apply_keeps_running_jobs_isolated") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut users = Users::new();
    let t = Tenants::create(&mut users).expect("users");
    let (a_user, g_user) = (&t.acme1.name, &t.globex1.name);
    let elems = "nft list map inet tenancy jobs_out | grep -o goto | wc -l";
    let run = node_with(
        &config_for(&t),
        "",
        &format!(
            "{}probe {g_user} $g before\n\
             echo \"elements_before=$({elems})\" >>$RES\n\
             /tenancy-uml/bin/tenancyctl --config /tmp/slurm/tenancy.toml firewall apply \
             >$J/apply.out 2>&1; echo \"apply_rc=$?\" >>$RES\n\
             echo \"apply_kept=$(sed -n 's/^running jobs kept in the jobs maps: //p' $J/apply.out)\" >>$RES\n\
             echo \"elements_after=$({elems})\" >>$RES\n\
             probe {g_user} $g after\nprobe {a_user} $a own_after\n{END_TWO_JOBS}",
            two_jobs(a_user, g_user)
        ),
    );
    let caps = acme_caps(&run);
    assert_held(&run, "before", &caps, "before firewall apply");
    assert_eq!(run.get("apply_rc"), "0", "{}", run.log);
    assert_eq!(run.get("elements_before"), "2", "{:?}", run.results);
    assert_eq!(
        run.get("elements_after"),
        "2",
        "firewall apply emptied the jobs maps: {:?}",
        run.results
    );
    let (a, g) = (run.get("a_job"), run.get("g_job"));
    let kept = run.get("apply_kept");
    assert!(
        kept.split(", ").any(|j| j == a) && kept.split(", ").any(|j| j == g),
        "apply kept {kept:?}, not jobs {a} and {g}"
    );
    assert_held(&run, "after", &caps, "after firewall apply");
    let own = run.get("own_after_connect");
    assert!(own.starts_with("ok"), "acme's own step after apply: {own}");
    assert_eq!(run.get("a_state"), "COMPLETED", "{}", run.log);
}
>>>>>>> issue-40-v2
