//! A job's `--mig` and the GPU GRES it asks Slurm for must agree: slurmctld hands out (and
//! bills) what the GRES names, the prolog makes what `--mig` names. With a MIG plan
//! (`[mig.plan]`, GRES slot mode, layers/mig/README.md) each typed GRES record is one plan
//! slot: a `--mig` job without the slot's GRES takes a slot Slurm thinks free, and a later job
//! that Slurm gives that slot fails its prolog and drains the node. Without a plan, a mismatch
//! still bills one profile while the job runs on another.
//!
//! What slurmctld receives: every `--gres`, `--gpus`, `--gpus-per-node|socket|task` and
//! `--tres-per-task` request lands in one of `tres_per_job`, `tres_per_node`,
//! `tres_per_socket`, `tres_per_task` as a comma list of `gres:gpu:<type>:<count>` (22.05,
//! `gres_prepend_tres_type` in src/common/gres.c) or `gres/gpu:<type>:<count>` (23.02 on,
//! src/interfaces/gres.c); type and count are optional.

use tenancy_config::{valid_profile, Config};

/// One GPU request of a job: `gpu`, `gpu:<count>`, `gpu:<type>` or `gpu:<type>:<count>`, as
/// the user gave it (without the `gres:`/`gres/` prefix Slurm adds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuRequest {
    /// The request as it reads on the command line, for messages: `gpu:3g.71gb:1`.
    pub text: String,
    /// The GPU type (`3g.71gb`, `1g.18gb_me`, `a100`), when one is named.
    pub gpu_type: Option<String>,
}

/// The GPU requests in one `tres_per_*` value; other GRES (and other TRES) are skipped.
pub fn gpu_requests(tres: &str) -> Vec<GpuRequest> {
    tres.split(',')
        .filter_map(|entry| {
            let entry = entry.trim();
            let bare = entry
                .strip_prefix("gres:")
                .or_else(|| entry.strip_prefix("gres/"))
                .unwrap_or(entry);
            // Socket bindings (`gpu:2(S:0-1)`) are not part of type or count.
            let core = bare.split_once('(').map_or(bare, |(c, _)| c);
            let mut parts = core.split(':');
            if parts.next() != Some("gpu") {
                return None;
            }
            // `gpu:<count>`: a count is digits; a type (`1g.18gb`, `a100`) is not.
            let rest: Vec<&str> = parts.collect();
            let gpu_type = match rest.as_slice() {
                [] => None,
                [one]
                    if one.bytes().next().is_some_and(|b| b.is_ascii_digit())
                        && !one.contains('.') =>
                {
                    None
                }
                [t, ..] => Some((*t).to_string()),
            };
            Some(GpuRequest {
                text: bare.to_string(),
                gpu_type,
            })
        })
        .collect()
}

/// The Slurm GRES type of a MIG profile: Slurm's types use `[a-z0-9._]`, so `+` becomes `_`
/// (`1g.18gb+me` is `1g.18gb_me`).
pub fn slurm_type(profile: &str) -> String {
    profile.replace('+', "_")
}

/// The MIG profile a GRES type names, if it names one (`1g.18gb_me` → `1g.18gb+me`).
fn profile_of(gpu_type: &str) -> Option<String> {
    let p = match gpu_type.strip_suffix("_me") {
        Some(core) => format!("{core}+me"),
        None => gpu_type.to_string(),
    };
    valid_profile(&p).then_some(p)
}

/// Whether the job's MIG profile (`--mig`, after the tier's checks) and its GPU requests agree;
/// the error is the one line the submitter sees, naming both.
pub fn check(config: &Config, profile: Option<&str>, gpus: &[GpuRequest]) -> Result<(), String> {
    let plan = !config.mig_plan.is_empty();
    let Some(profile) = profile else {
        // A MIG slot asked of Slurm with no slice for the prolog to make.
        if let Some(r) = gpus
            .iter()
            .find(|r| r.gpu_type.as_deref().and_then(profile_of).is_some())
        {
            let p = r
                .gpu_type
                .as_deref()
                .and_then(profile_of)
                .unwrap_or_default();
            return Err(format!(
                "GRES {} asks Slurm for a MIG slice of profile {p}, but the job has no --mig: \
                 the prolog would make no slice while Slurm accounts one; submit with \
                 --mig={p} --gres={}",
                r.text, r.text
            ));
        }
        return Ok(());
    };
    let want = slurm_type(profile);
    let remedy = format!("submit with --mig={profile} --gres=gpu:{want}:1");
    for r in gpus {
        match r.gpu_type.as_deref() {
            Some(t) if t == want => {}
            Some(t) => {
                return Err(format!(
                    "--mig={profile} and GRES {} disagree: Slurm would hand the job (and bill) \
                     a {t} GPU while the prolog makes a {profile} slice; {remedy}",
                    r.text
                ))
            }
            None if plan => {
                return Err(format!(
                    "--mig={profile} and GRES {} disagree: this cluster's MIG plan gives every \
                     slot a GRES type, and an untyped GPU request can be handed any slot; \
                     {remedy}",
                    r.text
                ))
            }
            None => {}
        }
    }
    if plan && gpus.is_empty() {
        return Err(format!(
            "--mig={profile} without GRES gpu:{want}: this cluster's MIG plan makes each slice \
             a GRES slot of slurmctld's, and a slice it does not know of takes a slot it would \
             give another job; {remedy}"
        ));
    }
    Ok(())
}

/// Whether an update (`scontrol update job`) touches a job's GPU requests: any `tres_per_*`
/// field it sets that asks for a GPU, or is emptied.
pub fn update_touches_gpus(fields: &[Option<&str>]) -> Option<String> {
    fields.iter().flatten().find_map(|v| {
        let gpus = gpu_requests(v);
        if v.trim().is_empty() {
            Some("(emptied)".to_string())
        } else {
            gpus.first().map(|r| r.text.clone())
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_release_s_spelling() {
        for tres in ["gres:gpu:1g.18gb:1", "gres/gpu:1g.18gb:1", "gpu:1g.18gb:1"] {
            assert_eq!(
                gpu_requests(tres),
                [GpuRequest {
                    text: "gpu:1g.18gb:1".into(),
                    gpu_type: Some("1g.18gb".into())
                }],
                "{tres}"
            );
        }
        assert_eq!(gpu_requests("gres/gpu:2")[0].gpu_type, None);
        assert_eq!(gpu_requests("gres/gpu")[0].gpu_type, None);
        assert_eq!(gpu_requests("gres/gpu:2(S:0-1)")[0].gpu_type, None);
        assert_eq!(
            gpu_requests("gres/gpu:3g.71gb")[0].gpu_type.as_deref(),
            Some("3g.71gb")
        );
        assert_eq!(
            gpu_requests("gres:shard:2,gres:gpu:a100:1")
                .iter()
                .map(|r| r.gpu_type.as_deref())
                .collect::<Vec<_>>(),
            [Some("a100")]
        );
        assert!(gpu_requests("cpu=4,mem=1G").is_empty());
    }

    fn config(plan: bool) -> Config {
        let mut text = String::from(
            "[cluster]\nname = \"t\"\nstate_dir = \"/tmp/s\"\naudit_log = \"/tmp/a\"\n\
             scratch_root = \"/tmp/x\"\n\n[tiers.t]\nmig_profiles = [\"1g.18gb\", \"3g.71gb\"]\n\
             share_gpu = true\nshare_node = true\nscratch_on_exit = \"wipe\"\n\n\
             [tenants.a]\ntier = \"t\"\ngroups = [\"a\"]\n",
        );
        if plan {
            text.push_str("\n[mig.plan.H200-141GB]\n\"1g.18gb\" = 7\n");
        }
        Config::parse(&text, std::path::Path::new("/t.toml")).expect("test config")
    }

    fn gpus(tres: &str) -> Vec<GpuRequest> {
        gpu_requests(tres)
    }

    #[test]
    fn mig_and_gres_must_name_one_profile() {
        for plan in [false, true] {
            let c = config(plan);
            assert_eq!(
                check(&c, Some("1g.18gb"), &gpus("gres:gpu:1g.18gb:1")),
                Ok(())
            );
            assert_eq!(check(&c, None, &gpus("gres/gpu:a100:2")), Ok(()));
            assert_eq!(check(&c, None, &[]), Ok(()));
            let e = check(&c, Some("1g.18gb"), &gpus("gres/gpu:3g.71gb:1")).unwrap_err();
            assert!(
                e.contains("--mig=1g.18gb") && e.contains("gpu:3g.71gb:1"),
                "names both: {e}"
            );
            let e = check(&c, None, &gpus("gres/gpu:3g.71gb:1")).unwrap_err();
            assert!(e.contains("no --mig") && e.contains("--mig=3g.71gb"), "{e}");
        }
        // Only a plan makes each slice a slot of slurmctld's.
        assert_eq!(check(&config(false), Some("1g.18gb"), &[]), Ok(()));
        assert_eq!(
            check(&config(false), Some("1g.18gb"), &gpus("gres/gpu:1")),
            Ok(())
        );
        let e = check(&config(true), Some("1g.18gb"), &[]).unwrap_err();
        assert!(
            e.contains("--mig=1g.18gb without GRES gpu:1g.18gb")
                && e.contains("--gres=gpu:1g.18gb:1"),
            "{e}"
        );
        let e = check(&config(true), Some("1g.18gb"), &gpus("gres/gpu:1")).unwrap_err();
        assert!(e.contains("untyped"), "{e}");
    }

    #[test]
    fn updates_of_gpu_requests_are_seen() {
        assert_eq!(update_touches_gpus(&[None, None, None, None]), None);
        assert_eq!(
            update_touches_gpus(&[None, Some("gres/gpu:3g.71gb:1"), None, None]).as_deref(),
            Some("gpu:3g.71gb:1")
        );
        assert_eq!(
            update_touches_gpus(&[None, Some("gres/shard:1"), None, None]),
            None
        );
        assert!(update_touches_gpus(&[Some(""), None, None, None]).is_some());
    }

    #[test]
    fn profiles_and_types_map_both_ways() {
        assert_eq!(slurm_type("1g.18gb+me"), "1g.18gb_me");
        assert_eq!(profile_of("1g.18gb_me").as_deref(), Some("1g.18gb+me"));
        assert_eq!(profile_of("7g.141gb").as_deref(), Some("7g.141gb"));
        assert_eq!(profile_of("a100"), None);
    }
}
