//! A refusal's record: the tenant a job asked for is the user's claim (`requested_tenant`),
//! `tenant` only what the prolog verified; the report counts an unverified refusal under
//! `(unverified)`, never for the tenant named.

use std::ffi::OsString;
use tenancy_accounting::report::{aggregate_paths, GroupBy, Query, UNVERIFIED};
use tenancy_audit_log::{Event, Record};
use tenancy_config::Config;
use tenancy_job::JobContext;
use tenancy_node::Spine;
use tenancy_test_support::TenancyToml;

fn job(id: &str, uid: &str, user: &str, tenant: &str) -> Vec<(OsString, OsString)> {
    [
        ("SLURM_JOB_ID", id),
        ("SLURM_JOB_UID", uid),
        ("SLURM_JOB_GID", uid),
        ("SLURM_JOB_USER", user),
        ("SLURMD_NODENAME", "node1"),
        ("SPANK_TENANCY_TENANT", tenant),
    ]
    .into_iter()
    .map(|(k, v)| (k.into(), v.into()))
    .collect()
}

#[test]
fn unverified_refusal_is_not_counted_for_the_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let text = TenancyToml::minimal("t", root).to_string();
    let config = Config::parse(&text, &root.join("tenancy.toml")).unwrap();
    let mut spine = Spine::new(&config, vec![], "tenancy-prolog").unwrap();
    // A member's job runs for acme; daemon (not a member) claims acme and is refused.
    let ok = spine.prolog(JobContext::from_vars(job("1", "0", "root", "acme")));
    assert_eq!(ok.code, 0, "{}", ok.message);
    let ctx = JobContext::from_vars(job("1", "0", "root", "acme")).unwrap();
    assert_eq!(spine.epilog(&ctx).code, 0);
    let denied = spine.prolog(JobContext::from_vars(job("2", "1", "daemon", "acme")));
    assert_eq!(denied.code, 1);
    assert!(denied.message.contains("not a member of tenant 'acme'"));

    let log = root.join("audit.jsonl");
    let records: Vec<Record> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let refusal = records
        .iter()
        .find(|r| r.event == Event::JobDenied)
        .expect("a job_denied record");
    assert_eq!(refusal.requested_tenant.as_deref(), Some("acme"));
    assert_eq!(refusal.tenant, None, "an unverified tenant was recorded");
    let start = records.iter().find(|r| r.event == Event::JobStart).unwrap();
    assert_eq!(start.tenant.as_deref(), Some("acme"));

    let by_tenant = |tenants: Vec<String>| {
        aggregate_paths(
            std::slice::from_ref(&log),
            Query {
                by: vec![GroupBy::Tenant],
                tenants,
                ..Query::default()
            },
            None,
        )
        .unwrap()
    };
    let all = by_tenant(vec![]);
    let acme = &all.groups[&vec!["acme".to_string()]];
    assert_eq!((acme.jobs, acme.denied), (1, 0), "{:?}", all.groups);
    assert_eq!(all.groups[&vec![UNVERIFIED.to_string()]].denied, 1);
    // Asking for acme's figures does not bring the claim in either.
    assert_eq!(by_tenant(vec!["acme".into()]).total.denied, 0);
}

/// Node pools, the prolog's last line: a pool tenant's job outside its pool, and another
/// tenant's job inside it, are refused with the reason (job_submit/tenancy keeps both from
/// being placed there; this holds when a pool changed while the job was pending).
#[test]
fn a_job_on_a_node_its_tenant_may_not_use_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let text = format!(
        "[cluster]\nname = \"t\"\nstate_dir = \"{r}/state\"\naudit_log = \"{r}/audit.jsonl\"\n\
         scratch_root = \"{r}/scratch\"\n[tiers.internal]\n[tiers.own]\nnodes = \"gpu[01-02]\"\n\
         [tenants.acme]\ntier = \"internal\"\ngroups = [\"daemon\"]\n\
         [tenants.globex]\ntier = \"own\"\ngroups = [\"root\"]\n",
        r = root.display()
    );
    let config = Config::parse(&text, &root.join("tenancy.toml")).unwrap();
    let mut spine = Spine::new(&config, vec![], "tenancy-prolog").unwrap();
    let on = |id: &str, tenant: &str, node: &str| {
        let mut vars = match tenant {
            "acme" => job(id, "1", "daemon", tenant),
            _ => job(id, "0", "root", tenant),
        };
        for (k, v) in vars.iter_mut() {
            if k == "SLURMD_NODENAME" {
                *v = node.into();
            }
        }
        vars
    };
    let ran = spine.prolog(JobContext::from_vars(on("11", "globex", "gpu02")));
    assert_eq!(ran.code, 0, "{}", ran.message);
    assert_eq!(
        spine
            .epilog(&JobContext::from_vars(on("11", "globex", "gpu02")).unwrap())
            .code,
        0
    );
    let outside = spine.prolog(JobContext::from_vars(on("12", "globex", "node1")));
    assert_eq!(outside.code, 1);
    assert!(
        outside
            .message
            .contains("node node1 is outside the node pool of tenant 'globex'"),
        "{}",
        outside.message
    );
    let inside = spine.prolog(JobContext::from_vars(on("13", "acme", "gpu01")));
    assert_eq!(inside.code, 1);
    assert!(
        inside
            .message
            .contains("node gpu01 is in the node pool of tier 'own'"),
        "{}",
        inside.message
    );
    let ok = spine.prolog(JobContext::from_vars(on("14", "acme", "node1")));
    assert_eq!(ok.code, 0, "{}", ok.message);
}
