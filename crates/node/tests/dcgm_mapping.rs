//! DCGM exporter's job mapping (`[cluster] dcgm_job_mapping_dir`): the prolog writes the job id
//! into the file of the job's MIG instance (`<gpu>.<gi>`), the epilog removes it, and a prolog
//! killed at any boundary leaves nothing there that the epilog does not remove.

mod common;

use common::{requires_root, text, World};
use std::path::{Path, PathBuf};

/// Adds `dcgm_job_mapping_dir` to the world's config (the driver reads it on every run).
fn with_mapping(w: &World) -> PathBuf {
    let dir = w.root.join("dcgm-jobs");
    w.rewrite_config(|c| {
        c.cluster().dcgm_job_mapping_dir(&dir);
    });
    dir
}

/// As root, with the NVML stand-in built: a one-GPU world [`with_mapping`], and the mapping
/// folder; None (skipped) otherwise.
fn mapping_world() -> Option<(World, PathBuf)> {
    if !requires_root("real cgroups and nftables under the prolog and epilog") {
        return None;
    }
    let Some(w) = World::new(1, None) else {
        eprintln!("SKIP: nvml-shim not built");
        return None;
    };
    let dir = with_mapping(&w);
    Some((w, dir))
}

/// (file name, its lines) of every mapping file, sorted.
fn mapping(dir: &Path) -> Vec<(String, String)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return vec![];
    };
    let mut v: Vec<(String, String)> = rd
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read_to_string(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn dcgm_mapping_follows_the_job() {
    let Some((w, dir)) = mapping_world() else {
        return;
    };
    let base = 7_600_000 + u64::from(std::process::id() % 100_000) * 10;
    let (j1, j2) = (base, base + 1);
    let e1 = w.job_env(j1, 0, Some("1g.18gb"));
    let e2 = w.job_env(j2, 1, Some("1g.18gb"));

    let out = w.run(&["prolog"], &e1);
    assert!(out.status.success(), "prolog {j1}: {}", text(&out));
    let out = w.run(&["prolog"], &e2);
    assert!(out.status.success(), "prolog {j2}: {}", text(&out));
    // Each job in the file of its own GPU instance, named as DCGM exporter reads it.
    let gi_of = |job: u64| {
        let mig = w.journal_step(job, "mig").unwrap()["made"].clone();
        format!("{}.{}", mig["gpu_index"], mig["gi_id"])
    };
    let mut want = vec![
        (gi_of(j1), format!("{j1}\n")),
        (gi_of(j2), format!("{j2}\n")),
    ];
    want.sort();
    assert_ne!(want[0].0, want[1].0, "two jobs in one GPU instance");
    assert_eq!(mapping(&dir), want, "while both jobs run");

    let out = w.run(&["epilog"], &e1);
    assert!(out.status.success(), "epilog {j1}: {}", text(&out));
    assert_eq!(
        mapping(&dir),
        vec![(gi_of(j2), format!("{j2}\n"))],
        "after job {j1} ended"
    );
    let out = w.run(&["epilog"], &e2);
    assert!(out.status.success(), "epilog {j2}: {}", text(&out));
    assert_eq!(mapping(&dir), vec![], "after both jobs ended");
    w.assert_nothing_left("after both epilogs");

    // A job without a MIG slice has no GPU to map: nothing written.
    let e3 = w.job_env(base + 2, 0, None);
    let out = w.run(&["prolog"], &e3);
    assert!(out.status.success(), "prolog without MIG: {}", text(&out));
    assert_eq!(mapping(&dir), vec![], "a job without a MIG slice");
    let out = w.run(&["epilog"], &e3);
    assert!(out.status.success(), "epilog without MIG: {}", text(&out));

    // Crash-safe: a prolog killed at every boundary in turn; the epilog leaves no mapping.
    let out = w.run(&["prolog"], &w.job_env(base + 3, 0, Some("1g.18gb")));
    assert!(out.status.success(), "prolog: {}", text(&out));
    let boundaries = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("boundary "))
        .count() as u32;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("dcgm"),
        "the dcgm layer has boundaries of its own: {}",
        text(&out)
    );
    let out = w.run(&["epilog"], &w.job_env(base + 3, 0, Some("1g.18gb")));
    assert!(out.status.success(), "epilog: {}", text(&out));
    for n in 1..=boundaries {
        let job = base + 4 + u64::from(n);
        let env = w.job_env(job, 0, Some("1g.18gb"));
        let out = w.run(&["prolog", "--crash-at", &n.to_string()], &env);
        assert!(
            !out.status.success(),
            "killed at boundary {n}: {}",
            text(&out)
        );
        let out = w.run(&["epilog"], &env);
        assert!(
            out.status.success(),
            "epilog after a kill at {n}: {}",
            text(&out)
        );
        assert_eq!(mapping(&dir), vec![], "killed at boundary {n}");
    }
    w.assert_nothing_left("after the crashed prologs' epilogs");
}

/// A mapping folder a user can write: the user could put a symlink or a folder where the
/// prolog writes a mapping file, fail the prolog and drain the node. The prolog refuses the
/// folder (nothing read or written there) and the job runs without its label.
#[test]
fn dcgm_mapping_dir_owned_by_a_user_is_refused() {
    let Some((w, dir)) = mapping_world() else {
        return;
    };
    std::fs::create_dir(&dir).unwrap();
    // nobody's folder, with what such a user leaves in every name a GPU instance could get.
    const NOBODY: u32 = 65534;
    std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).unwrap();
    for gpu in 0..2 {
        for gi in 0..16 {
            std::os::unix::fs::symlink("/etc/passwd", dir.join(format!("{gpu}.{gi}"))).unwrap();
        }
    }
    let planted = mapping_names(&dir);
    let job = 7_700_000 + u64::from(std::process::id() % 100_000);
    let env = w.job_env(job, 0, Some("1g.18gb"));
    let out = w.run(&["prolog"], &env);
    assert!(out.status.success(), "prolog: {}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("layer dcgm") && err.contains("owned by uid 65534") && err.contains("refused"),
        "the prolog says why the folder is not used: {err}"
    );
    assert_eq!(
        mapping_names(&dir),
        planted,
        "nothing written in the user's folder"
    );
    let steps = w.journal(job)["steps"].clone();
    assert!(
        !steps
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["layer"] == "dcgm"),
        "no dcgm step journaled: {steps}"
    );
    let out = w.run(&["epilog"], &env);
    assert!(out.status.success(), "epilog: {}", text(&out));
    assert_eq!(
        mapping_names(&dir),
        planted,
        "nothing removed from the user's folder"
    );

    // Writable by others, though root's: refused the same way.
    std::os::unix::fs::chown(&dir, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    let env = w.job_env(job + 1, 0, Some("1g.18gb"));
    let out = w.run(&["prolog"], &env);
    assert!(out.status.success(), "prolog: {}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("writable by its group or others"),
        "{}",
        text(&out)
    );
    assert_eq!(mapping_names(&dir), planted);
    let out = w.run(&["epilog"], &env);
    assert!(out.status.success(), "epilog: {}", text(&out));
    w.assert_nothing_left("after the refused folder's jobs");
}

/// The names in the folder (symlinks are not followed).
fn mapping_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}
