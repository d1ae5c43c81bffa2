//! Scratch layer: `<scratch_root>/<tenant>/job_<id>` owned by the job's user; wiped or retained
//! at job end as the tier says. With `scratch_encryption = "required"` the folder is encrypted
//! with a key of its own (docs/encrypted-scratch.md): the key is made when the intent is, its
//! identifier journaled with the intent before the key is added; at the end the key is removed
//! first (the erase), then the folder goes to the trash (wipe) or is retained locked.

use crate::layer::{
    Claim, JobPlan, LayerResult, Orphan, OrphanAction, OrphanScope, TypedLayer, KEPT_UNREADABLE,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::PathBuf;
use std::time::SystemTime;
use tenancy_config::{ScratchEncryption, ScratchOnExit};
use tenancy_job::contract::TaskEntry;
use tenancy_job::journal::Journal;
use tenancy_scratch::{Created, Erased, JobKey, KeyId, KeyStore, Retained, ScratchSpec, Wiped};

pub struct Scratch<'a> {
    pub root: PathBuf,
    pub config: &'a tenancy_config::Config,
    /// Mounts the last undo detached under the job folder, for the job's record.
    pub detached: Vec<PathBuf>,
    /// The key of the job whose intent this process made, until `make` gives it to the
    /// kernel (in memory only; wiped when dropped).
    pub key: Option<JobKey>,
    /// What the last undo did with an encrypted folder's key and tree, for the job's record.
    pub erased: Option<serde_json::Map<String, Value>>,
}

impl<'a> Scratch<'a> {
    pub fn new(config: &'a tenancy_config::Config) -> Scratch<'a> {
        Scratch {
            root: config.cluster.scratch_root.clone(),
            config,
            detached: Vec::new(),
            key: None,
            erased: None,
        }
    }
}

impl Scratch<'_> {
    /// The gids of the tenant's groups when it has more than one (members through any of them
    /// reach the tenant folder through its ACL); none for a tenant of one group, the usual
    /// case, which costs no lookup.
    fn tenant_groups(&self, tenant: &str) -> Vec<u32> {
        match self.config.tenants.get(tenant) {
            Some(t) if t.groups.len() > 1 => t
                .groups
                .iter()
                .filter_map(|g| tenancy_config::group_gid(g))
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// Everything teardown needs, including the tier's policy at job start.
#[derive(Serialize, Deserialize)]
pub struct Intent {
    spec: ScratchSpec,
    on_exit: ScratchOnExit,
    /// An encrypted folder's key, by identifier: journaled before the key is added, so
    /// teardown and reconcile always know which key to remove.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key_id: Option<KeyId>,
    /// Retain tiers: the state folder whose key store keeps the key wrapped by the node key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key_store: Option<PathBuf>,
}

impl TypedLayer for Scratch<'_> {
    type Intent = Intent;
    type Made = Created;

    fn name(&self) -> &'static str {
        "scratch"
    }

    fn intend(&mut self, plan: &JobPlan) -> LayerResult<Option<Intent>> {
        let spec = ScratchSpec {
            root: self.root.clone(),
            tenant: plan.tenant.clone(),
            tenant_gid: plan.tenant_gid,
            job_id: plan.job_id,
            uid: plan.uid,
            gid: plan.gid,
            mode: plan.tier.scratch_mode,
            quota: None,
            tenant_groups: self.tenant_groups(&plan.tenant),
        };
        spec.validate()?;
        // The key exists in this process alone until `make` adds it; its identifier goes into
        // the journal with the intent first.
        self.key = None;
        let (key_id, key_store) = match plan.tier.scratch_encryption {
            ScratchEncryption::Off => (None, None),
            ScratchEncryption::Required => {
                let key = JobKey::generate().map_err(|e| {
                    format!("cannot draw the job's key from the kernel (getrandom): {e}")
                })?;
                let id = key.id();
                self.key = Some(key);
                let store = (plan.tier.scratch_on_exit == ScratchOnExit::Retain)
                    .then(|| self.config.cluster.state_dir.clone());
                (Some(id), store)
            }
        };
        Ok(Some(Intent {
            spec,
            on_exit: plan.tier.scratch_on_exit,
            key_id,
            key_store,
        }))
    }

    fn make(&mut self, intent: &Intent, _: &Journal) -> LayerResult<Created> {
        let Some(id) = intent.key_id else {
            return Ok(tenancy_scratch::create(&intent.spec)?);
        };
        let key = self.key.take().filter(|k| k.id() == id).ok_or_else(|| {
            format!(
                "the key {id} of this intent is not in this process (only the prolog that journaled an intent can make its folder); the job does not run"
            )
        })?;
        let store = intent.key_store.as_deref().map(KeyStore::new);
        Ok(tenancy_scratch::create_encrypted(
            &intent.spec,
            &key,
            store.as_ref(),
        )?)
    }

    fn undo(&mut self, intent: &Intent, _made: Option<&Created>) -> LayerResult<()> {
        self.erased = None;
        self.detached = match (intent.on_exit, intent.key_id) {
            (ScratchOnExit::Wipe, None) => match tenancy_scratch::wipe(&intent.spec)? {
                Wiped::Removed { detached, .. } => detached,
                Wiped::AlreadyGone { .. } => Vec::new(),
            },
            (ScratchOnExit::Wipe, Some(id)) => {
                let erased = tenancy_scratch::erase(&intent.spec, id)?;
                let mut notes = serde_json::Map::new();
                notes.insert("key_id".into(), id.to_string().into());
                let (key, detached) = match erased {
                    Erased::Trashed {
                        key,
                        trash,
                        detached,
                        ..
                    } => {
                        notes.insert("moved_to".into(), trash.display().to_string().into());
                        (key, detached)
                    }
                    Erased::Removed { key, detached, .. } => (key, detached),
                    Erased::AlreadyGone { key, .. } => (key, Vec::new()),
                };
                notes.insert("key_removal".into(), serde_json::to_value(key)?);
                self.erased = Some(notes);
                detached
            }
            (ScratchOnExit::Retain, key_id) => {
                let retained = match key_id {
                    None => tenancy_scratch::retain(&intent.spec, SystemTime::now())?,
                    Some(id) => {
                        tenancy_scratch::retain_encrypted(&intent.spec, id, SystemTime::now())?
                    }
                };
                match retained {
                    Retained::Moved {
                        detached, key, to, ..
                    } => {
                        if let (Some(id), Some(key)) = (key_id, key) {
                            let mut notes = serde_json::Map::new();
                            notes.insert("key_id".into(), id.to_string().into());
                            notes.insert("key_removal".into(), serde_json::to_value(key)?);
                            notes.insert("retained_at".into(), to.display().to_string().into());
                            self.erased = Some(notes);
                        }
                        detached
                    }
                    Retained::AlreadyGone { .. } => Vec::new(),
                }
            }
        };
        Ok(())
    }

    fn undo_notes(&mut self) -> serde_json::Map<String, Value> {
        let mut notes = self.erased.take().unwrap_or_default();
        let detached = std::mem::take(&mut self.detached);
        if !detached.is_empty() {
            notes.insert(
                "detached_mounts".into(),
                detached.iter().map(|p| p.display().to_string()).collect(),
            );
        }
        notes
    }

    fn resource_id(&self, intent: &Intent, _: Option<&Created>) -> String {
        intent.spec.job_dir().display().to_string()
    }

    /// The job's folder is its tasks' temporary folder.
    fn task_entry(&self, made: &Created) -> TaskEntry {
        let path = made.path.display().to_string();
        TaskEntry {
            join_cgroups: Vec::new(),
            env: vec![
                ("TMPDIR".into(), path.clone()),
                ("TENANCY_SCRATCH".into(), path),
            ],
            ..TaskEntry::default()
        }
    }

    /// Scratch folders are named by tenant and job; an encrypted one's key by its id.
    fn claims(&self, intent: &Intent, _: Option<&Created>) -> Vec<Claim> {
        let mut claims = vec![Claim::JobFolder {
            tenant: intent.spec.tenant.clone(),
            job_id: intent.spec.job_id,
        }];
        if let Some(id) = intent.key_id {
            claims.push(Claim::ScratchKey(id.to_string()));
        }
        claims
    }

    /// Job folders no journal claims and Slurm no longer has (on a scratch_root the nodes
    /// share, a job of another node has its folder here), then retained folders past the
    /// longest retention of any tier.
    fn orphans(&mut self, scope: &OrphanScope) -> Vec<Orphan> {
        let root = self.root.clone();
        if !root.is_dir() {
            return Vec::new();
        }
        let mut out = Vec::new();
        let known = match scope.known {
            Ok(k) => Some(k),
            Err(why) => {
                out.push(
                    Orphan::new(
                        "scratch",
                        root.display().to_string(),
                        format!("Slurm cannot be asked which jobs it still has: {why}"),
                    )
                    .left(
                        "job folders not checked (on a scratch_root the nodes share, they may \
                         be jobs running on other nodes)",
                    ),
                );
                None
            }
        };
        for (tenant, tdir) in super::subdirs(&root)
            .into_iter()
            .filter(|_| known.is_some())
        {
            if !scope.wanted(&tenant) || tenancy_scratch::validate_tenant_name(&tenant).is_err() {
                continue;
            }
            let gid = match std::fs::symlink_metadata(&tdir) {
                Ok(m) => std::os::unix::fs::MetadataExt::gid(&m),
                Err(_) => continue,
            };
            for (name, dir) in super::subdirs(&tdir) {
                let Some(job) = super::job_id_of(&name) else {
                    continue;
                };
                // Owned here, or a job Slurm still has, here or on another node sharing the
                // scratch_root.
                let claim = Claim::JobFolder {
                    tenant: tenant.clone(),
                    job_id: job,
                };
                if scope.owned.contains(&claim) || known.is_some_and(|k| k.contains(&job)) {
                    continue;
                }
                if scope.unreadable.contains(&job) {
                    out.push(
                        Orphan::new(
                            "scratch",
                            dir.display().to_string(),
                            "job folder of a job whose journal is unreadable",
                        )
                        .job(job)
                        .tenant(&tenant)
                        .left(KEPT_UNREADABLE),
                    );
                    continue;
                }
                let spec = ScratchSpec {
                    root: root.clone(),
                    tenant: tenant.clone(),
                    tenant_gid: gid,
                    job_id: job,
                    uid: 65534,
                    gid: 65534,
                    mode: tenancy_scratch::DEFAULT_JOB_MODE,
                    quota: None,
                    tenant_groups: Vec::new(),
                };
                // An encrypted folder's key goes before its tree.
                let key = tenancy_scratch::folder_key(&root, &tenant, &name);
                out.push(
                    Orphan::new(
                        "scratch",
                        dir.display().to_string(),
                        "job folder no journal owns",
                    )
                    .job(job)
                    .tenant(&tenant)
                    .remove(move || {
                        match key {
                            Some(id) => tenancy_scratch::wipe_encrypted(&spec, id),
                            None => tenancy_scratch::wipe(&spec),
                        }
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                    }),
                );
            }
        }
        out.extend(self.trash_orphans(&root, scope.apply));
        out.extend(self.retained_orphans(&root, scope.apply));
        out.extend(self.key_orphans(&root, scope));
        out
    }
}

impl Scratch<'_> {
    /// Erased job folders still in the trash (their deletion was cut short: a crash, a
    /// detached deleter that was ended), deleted by the search itself with `--apply`.
    fn trash_orphans(&self, root: &std::path::Path, apply: bool) -> Vec<Orphan> {
        let entries = match tenancy_scratch::trash::list(root) {
            Ok(e) => e,
            Err(e) => {
                return vec![Orphan::new(
                    "trash",
                    root.join(tenancy_scratch::trash::TRASH_DIR)
                        .display()
                        .to_string(),
                    format!("cannot be read: {e}"),
                )
                .left("erased folders not checked")]
            }
        };
        if entries.is_empty() {
            return Vec::new();
        }
        let row = |e: &tenancy_scratch::trash::TrashEntry, action: String, ok: bool, left: bool| {
            let mut o = Orphan::new(
                "trash",
                e.path.display().to_string(),
                "erased job folder (key removed) waiting for deletion",
            )
            .job(e.job_id)
            .tenant(&e.tenant);
            o.what = OrphanAction::Done {
                action,
                ok,
                left,
                audit: apply,
            };
            o
        };
        if !apply {
            return entries
                .iter()
                .map(|e| row(e, "would remove".into(), true, true))
                .collect();
        }
        match tenancy_scratch::trash::empty(root, true) {
            Ok(done) => done
                .removed
                .iter()
                .map(|(e, _)| row(e, "removed".into(), true, false))
                .chain(
                    done.failed
                        .iter()
                        .map(|(e, why)| row(e, format!("failed: {why}"), false, true)),
                )
                .collect(),
            Err(e) => vec![Orphan::new(
                "trash",
                root.join(tenancy_scratch::trash::TRASH_DIR)
                    .display()
                    .to_string(),
                format!("cannot be emptied: {e}"),
            )
            .left("erased folders left")],
        }
    }

    /// Wrapped keys no journal and no retained folder names (a prolog that failed after
    /// keeping its key, a folder removed by hand): destroyed with `--apply`.
    fn key_orphans(&self, root: &std::path::Path, scope: &OrphanScope) -> Vec<Orphan> {
        let store = KeyStore::new(&self.config.cluster.state_dir);
        let ids = match store.ids() {
            Ok(ids) if ids.is_empty() => return Vec::new(),
            Ok(ids) => ids,
            Err(e) => {
                return vec![Orphan::new(
                    "scratch-key",
                    store.dir().display().to_string(),
                    format!("cannot be read: {e}"),
                )
                .left("wrapped keys not checked")]
            }
        };
        let retained = match tenancy_scratch::retained_keys(root) {
            Ok(r) => r,
            Err(e) => {
                return vec![Orphan::new(
                    "scratch-key",
                    store.dir().display().to_string(),
                    format!("the retained folders cannot be read: {e}"),
                )
                .left("wrapped keys not checked")]
            }
        };
        let mut out = Vec::new();
        for id in ids {
            if retained.contains(&id) || scope.owned.contains(&Claim::ScratchKey(id.to_string())) {
                continue;
            }
            if !scope.unreadable.is_empty() {
                out.push(
                    Orphan::new(
                        "scratch-key",
                        store.path_of(id).display().to_string(),
                        "wrapped key no retained folder names",
                    )
                    .left(KEPT_UNREADABLE),
                );
                continue;
            }
            let s = store.clone();
            out.push(
                Orphan::new(
                    "scratch-key",
                    store.path_of(id).display().to_string(),
                    "wrapped key no journal and no retained folder names",
                )
                .remove(move || s.destroy(id).map(|_| ()).map_err(|e| e.to_string())),
            );
        }
        out
    }

    /// Retained folders past the longest retention of any tier (so no tenant loses data
    /// early), removed by the search itself with `--apply`.
    fn retained_orphans(&self, root: &std::path::Path, apply: bool) -> Vec<Orphan> {
        let days = self
            .config
            .tiers
            .values()
            .map(|t| u64::from(t.retain_days))
            .max()
            .unwrap_or(0);
        let store = KeyStore::new(&self.config.cluster.state_dir);
        let purged = tenancy_scratch::purge_retained_with(
            root,
            days,
            SystemTime::now(),
            !apply,
            Some(&store),
        );
        let actions = match purged {
            Err(e) => {
                return vec![Orphan::new(
                    "retained",
                    root.display().to_string(),
                    format!("cannot purge: {e}"),
                )
                .left("retained folders not checked")]
            }
            Ok(actions) => actions,
        };
        actions
            .into_iter()
            .map(|a| retained_orphan(a, days))
            .collect()
    }
}

/// What the orphan search reports for one action of the retained folders' purge (`days`: the
/// longest retention of any tier).
fn retained_orphan(a: tenancy_scratch::Action, days: u64) -> Orphan {
    let past = |path: &std::path::Path, tenant: &str, job_id: u64, age_days: u64| {
        Orphan::new(
            "retained",
            path.display().to_string(),
            format!("retained {age_days} day(s), past {days}"),
        )
        .job(job_id)
        .tenant(tenant)
    };
    match a {
        tenancy_scratch::Action::Remove {
            path,
            tenant,
            job_id,
            age_days,
            dry_run,
            ..
        } => {
            let mut o = past(&path, &tenant, job_id, age_days);
            o.what = if dry_run {
                OrphanAction::Done {
                    action: "would remove".into(),
                    ok: true,
                    left: true,
                    audit: false,
                }
            } else {
                OrphanAction::Done {
                    action: "removed".into(),
                    ok: true,
                    left: false,
                    audit: true,
                }
            };
            o
        }
        tenancy_scratch::Action::DestroyKey {
            path,
            tenant,
            job_id,
            key_id,
            wrapped,
            dry_run,
        } => {
            let what = match &wrapped {
                Some(w) => format!("its wrapped key {}", w.display()),
                None => "its key".to_string(),
            };
            let mut o = Orphan::new(
                "retained-key",
                path.display().to_string(),
                format!("key {key_id} of a retained folder past {days} day(s): {what}"),
            )
            .job(job_id)
            .tenant(&tenant);
            o.what = OrphanAction::Done {
                action: if dry_run {
                    "would destroy".into()
                } else {
                    "destroyed".into()
                },
                ok: true,
                left: dry_run,
                audit: !dry_run,
            };
            o
        }
        tenancy_scratch::Action::Skip { path, reason } => {
            Orphan::new("retained", path.display().to_string(), reason).left("not ours or unsafe")
        }
        tenancy_scratch::Action::Failed {
            path,
            tenant,
            job_id,
            age_days,
            error,
            ..
        } => {
            let mut o = past(&path, &tenant, job_id, age_days);
            o.what = OrphanAction::Done {
                action: format!("failed: {error}"),
                ok: false,
                left: true,
                audit: true,
            };
            o
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::Layer;

    /// A tenant of several groups gets them all in its scratch intent (the tenant folder's
    /// ACL lets members through any of them in); a tenant of one group needs none.
    #[test]
    fn the_intent_names_every_group_of_a_tenant_of_several() {
        let mut text = tenancy_test_support::TenancyToml::under("t", std::path::Path::new("/"));
        text.tier("internal");
        text.tenant("acme")
            .tier("internal")
            .groups(["root", "daemon"]);
        text.tenant("solo").tier("internal").groups(["bin"]);
        let config =
            tenancy_config::Config::parse(&text.to_string(), std::path::Path::new("/t.toml"))
                .unwrap();
        let mut layer = Scratch::new(&config);
        let plan = |tenant: &str| JobPlan {
            job_id: 7,
            uid: 1000,
            gid: 1000,
            user: "u1000".into(),
            node: "n".into(),
            tenant: tenant.into(),
            tenant_gid: 0,
            tier: config.tiers["internal"].clone(),
            profile: None,
            gres_gpus: None,
            others: Vec::new(),
        };
        let mut groups = |tenant: &str| -> Vec<u32> {
            let intent: Intent =
                serde_json::from_value(Layer::intend(&mut layer, &plan(tenant)).unwrap().unwrap())
                    .unwrap();
            intent.spec.tenant_groups
        };
        let daemon = tenancy_config::group_gid("daemon").unwrap();
        assert_eq!(groups("acme"), vec![0, daemon]);
        assert_eq!(groups("solo"), Vec::<u32>::new());
    }
}
