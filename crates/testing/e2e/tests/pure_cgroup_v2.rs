//! The product on a pure cgroup v2 node, where Slurm's cgroup/v2 plugin owns the jobs' cgroups
//! (`ConstrainDevices=yes`, `ConstrainRAMSpace=yes`): a user-mode-linux kernel booted on the
//! Slurm 24.11 root (src/uml_node.rs; the shell it runs in scripts/uml/ and scripts/pure_v2/),
//! with the SPANK plugin built for 24.11,
//! tenancy-prolog/-epilog, the NVML stand-in and the firewall installed as on a real node.
//! Needs root; skips loudly otherwise. The kernel and root are made when missing (minutes, once;
//! cached in /var/cache/slurm-tenancy, or TENANCY_ROOTS_DIR and TENANCY_UML_DIR); each boot is
//! on an overlay of its own of the cached root, and a failure to make them fails the test.

use tenancy_e2e::uml_node::NodeRun;
use tenancy_e2e::{scenario, Options, PureV2Node, TenancyToml};

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
        assert_eq!(run.get("state_64"), "OUT_OF_MEMORY", "{}", run.log);
        assert!(
            cgroup.contains("slurmstepd.scope/job_") && !cgroup.contains("/tenancy/"),
            "the task left Slurm's job cgroup: {cgroup}"
        );
    }
);

// The pure v2 node's half of slurm_daemons.rs's test: globex's srun reporting acme's port
// (the LD_PRELOAD port rewrite) gets slurmstepd to connect there from globex's job folder,
// which the firewall judges as globex's: acme's job takes no connection, globex's drop counter
// moves and acme's does not (its listener's answers to a root:root connection of globex's
// slurmstepd used to be dropped as acme's). acme's own srun steered the same way reaches
// acme's port.
scenario!(
    srun_io_port_cannot_reach_another_tenant,
    Options::default(),
    |node: &mut PureV2Node| {
        let run = node.run(include_str!("../scripts/pure_v2/srun_io_port.sh"));
        assert_eq!(
            run.get("attack_accepted"),
            "0",
            "slurmstepd of globex's step reached acme's port\n{}",
            run.log
        );
        let counts = |k: &str| -> Vec<u64> {
            run.get(k)
                .split(' ')
                .map(|n| n.parse().unwrap_or(0))
                .collect()
        };
        let g = counts("globex_drops");
        assert!(
            g.len() == 2 && g[1] > g[0],
            "globex's drop counter did not move: {g:?}\n{}",
            run.log
        );
        let a = counts("acme_drops");
        assert!(
            a.len() == 2 && a[0] == a[1],
            "acme's drop counter moved ({a:?}): part of the relay was charged to the tenant it \
             was aimed at\n{}",
            run.log
        );
        assert_ne!(
            run.get("control_accepted"),
            "0",
            "control: acme's own steered step did not reach acme's port (the rewrite did not \
             work)\n{}",
            run.log
        );
    }
);

// The pure v2 node's half of slurm_daemons.rs's test: with no infrastructure entry and no
// egress entry, the owner's srun (stdin in, stdout out) and sattach (into a running step) work
// from the node's shell (the node's name is its own address, not loopback) and from a login
// host in a network namespace beside the node.
scenario!(
    srun_and_sattach_from_outside_the_job_still_work,
    Options::default().config(tenancy_e2e::steer::without_infrastructure),
    |node: &mut PureV2Node| {
        let run = node.run(include_str!("../scripts/pure_v2/outside_srun_sattach.sh"));
        assert_eq!(run.get("infrastructure"), "1", "{}", run.log);
        for at in ["node", "login"] {
            assert_eq!(
                run.get(&format!("srun_{at}")),
                format!("hello from the {at}"),
                "srun from the {at}\n{}",
                run.log
            );
            assert_ne!(
                run.get(&format!("sattach_{at}")),
                "0",
                "sattach from the {at} got no echo of its input\n{}",
                run.log
            );
        }
        assert_eq!(run.get("a_state"), "COMPLETED", "{}", run.log);
    }
);

// ---- the isolation follows Slurm's job folder for the job's whole life ----------------------

/// The node's own address (192.0.2.10, where srun runs on this node) among the infrastructure:
/// slurmstepd's I/O connection to an srun run from the node's shell is the user's and judged
/// (issue 40, item 6: to be judged as the job's), and the scenarios below are about the job
/// folder, not about that connection.
// item 6 workaround: drop when slurmstepd's I/O connection is judged as the job's
fn node_address_as_infrastructure(c: &mut TenancyToml) {
    c.network()
        .infrastructure(["127.0.0.1/32:1-65535/tcp", "192.0.2.10/32:1-65535/tcp"]);
}

/// What every scenario below starts with: acme's listening job, globex's allocation, acme's
/// own probe (scripts/pure_v2/two_jobs.sh); `body` follows.
fn two_jobs_then(body: &str) -> String {
    [include_str!("../scripts/pure_v2/two_jobs.sh"), body].concat()
}

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

// Slurm's cgroup/v2 plugin removes a job's folder when its last running step ends and makes
// it again, with a new cgroup id, for the next; the firewall elements and the device program
// are keyed on the folder the prolog made. Without `PrologFlags=Contain` (every step is the
// last running one), and with Contain once the user ended their own extern step, globex's
// second step still runs in the job's folder of the prolog (the keeper holds it), is dropped
// at acme's port and gets EPERM on acme's capability nodes; the epilog removes the folder. A
// folder made again anyway (its keeper removed by root) is refused before user code.
scenario!(
    job_folder_recreated_by_slurm_keeps_the_isolation,
    Options::default().config(node_address_as_infrastructure),
    |node: &mut PureV2Node| {
        // Without Contain: no extern step, each step is the job's last running one.
        let run = node.run_with(
            &["PrologFlags=Alloc"],
            &two_jobs_then(include_str!(
                "../scripts/pure_v2/job_folder_without_contain.sh"
            )),
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

        // With Contain: the user ends their own extern step; then the keeper is removed by
        // root (nothing of the product does that) and Slurm makes the folder again: refused.
        let run = node.run(&two_jobs_then(include_str!(
            "../scripts/pure_v2/job_folder_extern_killed.sh"
        )));
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
        // Without its keeper, Slurm removed the folder after the step and made it again for
        // the next: that step is refused before user code, never run unisolated.
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
);

// `tenancyctl firewall apply` while jobs run (docs/admin-guide.md: after every config change) replaces the
// table; on this pure v2 node its jobs maps hold one pair of elements per running job, which
// the new table keeps (the same transaction): globex's next step is still dropped at acme's
// port, and acme's own still reaches it.
scenario!(
    firewall_apply_keeps_running_jobs_isolated,
    Options::default().config(node_address_as_infrastructure),
    |node: &mut PureV2Node| {
        let run = node.run(&two_jobs_then(include_str!(
            "../scripts/pure_v2/firewall_apply_keeps_jobs.sh"
        )));
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
);
