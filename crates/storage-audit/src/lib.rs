//! `storage-audit`: finds files and folders that a member of another tenant could read, write or
//! enter, plus world-writable folders without sticky bit, set-id files and symlinks leading out of
//! a tenant's tree.
//!
//! Model. A *tenant tree* is the topmost folder (on the walk, or among the ancestors of a walked
//! path) whose group maps to a tenant in the [`TenantMap`]. For every entry in tenant T's tree the
//! audit evaluates, for "others" (anyone in no tenant's ids) and for every other tenant U whose
//! ids appear on the entry or its ancestors, the permissions the kernel would grant (owner, named
//! ACL user, owning/named ACL groups with mask, other), but only when that identity can also
//! traverse every ancestor (so a world-readable file inside a 0700 job folder is not reported).
//! A member of U is assumed to hold every gid and uid listed for U. Symlinks are never followed;
//! the walk stays on the file system of each PATH.

mod encryption;

use anyhow::{bail, Context as _};
use rustix::fs::{self as rfs, AtFlags, FileType, Mode, Stat};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::CStr;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tenancy_scratch::acl::{
    perm_str, Acl, ACL_GROUP, ACL_GROUP_OBJ, ACL_OTHER, ACL_USER, ACL_USER_OBJ,
};

use tenancy_scratch::fsutil::{open_beneath_same_fs, DIR_FLAGS};

/// Ids that belong to one tenant.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantIds {
    pub gids: BTreeSet<u32>,
    #[serde(default)]
    pub uids: BTreeSet<u32>,
}

/// Tenant name -> ids (built by the lead from the admin config).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantMap {
    pub tenants: BTreeMap<String, TenantIds>,
    /// The scratch root and the tenants whose tier requires `scratch_encryption`: their job
    /// folders there must be encrypted (rule `unencrypted-scratch`).
    #[serde(default)]
    pub encrypted_scratch: Option<(PathBuf, BTreeSet<String>)>,
}

impl TenantMap {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn insert(
        &mut self,
        name: impl Into<String>,
        gids: impl IntoIterator<Item = u32>,
        uids: impl IntoIterator<Item = u32>,
    ) -> &mut Self {
        let e = self.tenants.entry(name.into()).or_default();
        e.gids.extend(gids);
        e.uids.extend(uids);
        self
    }

    /// The job folders of `tenants` under the scratch root `root` must be encrypted.
    pub fn require_encrypted_scratch(
        &mut self,
        root: &Path,
        tenants: impl IntoIterator<Item = String>,
    ) -> &mut Self {
        self.encrypted_scratch = Some((root.to_path_buf(), tenants.into_iter().collect()));
        self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// Another tenant, or everyone, can read/write/enter it.
    Exposed,
    /// Inside tenant T's tree, but its group belongs to another tenant.
    ForeignGroup,
    /// Inside tenant T's tree, but owned by a user of another tenant.
    ForeignOwner,
    /// A default ACL that grants another tenant's user or group on new entries.
    DefaultAclGrant,
    /// A world-writable folder without sticky bit that others can reach.
    WorldWritableNoSticky,
    /// A setuid or setgid regular file.
    SetId,
    /// A symlink whose target (resolved by text) lies outside the tenant's tree.
    SymlinkOutOfTree,
    /// A job scratch folder of a tier that requires `scratch_encryption`, not encrypted.
    UnencryptedScratch,
}

impl Rule {
    /// The rule's name, as the JSON and `tenancyctl storage-audit` print it.
    pub fn name(self) -> &'static str {
        match self {
            Rule::Exposed => "exposed",
            Rule::ForeignGroup => "foreign-group",
            Rule::ForeignOwner => "foreign-owner",
            Rule::DefaultAclGrant => "default-acl-grant",
            Rule::WorldWritableNoSticky => "world-writable-no-sticky",
            Rule::SetId => "set-id",
            Rule::SymlinkOutOfTree => "symlink-out-of-tree",
            Rule::UnencryptedScratch => "unencrypted-scratch",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub rule: Rule,
    /// (JSON: the path as text, bytes that are not UTF-8 escaped as `\xNN`, so any name a
    /// user can make still serializes.)
    #[serde(with = "lossless_path")]
    pub path: PathBuf,
    /// Tenant whose tree holds the entry (none above the tenant trees).
    pub tenant: Option<String>,
    /// Who gets access: "others", "tenant <name>", or empty.
    pub who: String,
    /// Permissions that identity gets (rwx), or empty.
    pub perms: String,
    pub detail: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    pub scanned: u64,
    pub findings: Vec<Finding>,
    pub errors: Vec<String>,
}

impl Report {
    /// What `tenancyctl storage-audit` exits with: 1 when anything is found, 2 when nothing is
    /// found but parts could not be audited, 0 when clean.
    pub fn exit_code(&self) -> ExitCode {
        if !self.findings.is_empty() {
            ExitCode::from(1)
        } else if !self.errors.is_empty() {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        }
    }
}

// ---------------------------------------------------------------------------------------------

struct Index {
    names: Vec<String>,
    by_gid: HashMap<u32, usize>,
    by_uid: HashMap<u32, usize>,
    gids: Vec<BTreeSet<u32>>,
    uids: Vec<BTreeSet<u32>>,
}

impl Index {
    fn new(map: &TenantMap) -> anyhow::Result<Index> {
        let mut ix = Index {
            names: vec![],
            by_gid: HashMap::new(),
            by_uid: HashMap::new(),
            gids: vec![],
            uids: vec![],
        };
        for (i, (name, ids)) in map.tenants.iter().enumerate() {
            ix.names.push(name.clone());
            ix.gids.push(ids.gids.clone());
            ix.uids.push(ids.uids.clone());
            for g in &ids.gids {
                if let Some(o) = ix.by_gid.insert(*g, i) {
                    bail!(
                        "gid {g} is mapped to two tenants ({} and {name}); fix the tenant config",
                        map.tenants.keys().nth(o).unwrap()
                    );
                }
            }
            for u in &ids.uids {
                if let Some(o) = ix.by_uid.insert(*u, i) {
                    bail!(
                        "uid {u} is mapped to two tenants ({} and {name}); fix the tenant config",
                        map.tenants.keys().nth(o).unwrap()
                    );
                }
            }
        }
        Ok(ix)
    }
}

/// Who is asking: everyone outside all tenants, or a member of tenant i.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Who {
    Others,
    Tenant(usize),
}

struct Meta<'a> {
    st: &'a Stat,
    acl: Option<&'a Acl>,
}

fn access(ix: &Index, m: &Meta, who: Who) -> u8 {
    let mode = m.st.st_mode;
    // Linux (fs/namei.c acl_permission_check) consults the ACL only when the group-class bits
    // (the ACL mask) are not all zero; otherwise it falls back to plain owner/group/other bits,
    // so a named entry under an empty mask does not shut its group out of the "other" bits.
    let acl = if mode & 0o070 != 0 { m.acl } else { None };
    let m = &Meta { st: m.st, acl };
    let other = m
        .acl
        .and_then(|a| a.get(ACL_OTHER))
        .unwrap_or((mode & 7) as u8);
    let Who::Tenant(t) = who else { return other };
    if ix.uids[t].contains(&m.st.st_uid) {
        return m
            .acl
            .and_then(|a| a.get(ACL_USER_OBJ))
            .unwrap_or(((mode >> 6) & 7) as u8);
    }
    if let Some(a) = m.acl {
        let mut named = None;
        for e in a.named(ACL_USER) {
            if ix.uids[t].contains(&e.id) {
                named = Some(named.unwrap_or(0) | e.perm);
            }
        }
        if let Some(p) = named {
            return p & a.mask();
        }
    }
    let mut matched = false;
    let mut perms = 0u8;
    if ix.gids[t].contains(&m.st.st_gid) {
        matched = true;
        perms |= m
            .acl
            .and_then(|a| a.get(ACL_GROUP_OBJ))
            .unwrap_or(((mode >> 3) & 7) as u8);
    }
    if let Some(a) = m.acl {
        for e in a.named(ACL_GROUP) {
            if ix.gids[t].contains(&e.id) {
                matched = true;
                perms |= e.perm;
            }
        }
        if matched {
            perms &= a.mask();
        }
    }
    if matched {
        perms
    } else {
        other
    }
}

/// What the walk knows on the way down.
#[derive(Clone, Debug)]
struct Ctx {
    tenant: Option<usize>,
    tree_root: Option<Arc<PathBuf>>,
    reach_others: bool,
    /// Reachability for tenants whose ids appeared on the way (others fall back to reach_others).
    reach: Vec<(usize, bool)>,
}

impl Ctx {
    fn top() -> Ctx {
        Ctx {
            tenant: None,
            tree_root: None,
            reach_others: true,
            reach: vec![],
        }
    }
    fn reach_of(&self, t: usize) -> bool {
        self.reach
            .iter()
            .find(|(i, _)| *i == t)
            .map(|(_, r)| *r)
            .unwrap_or(self.reach_others)
    }
}

fn tenants_mentioned(ix: &Index, st: &Stat, acl: Option<&Acl>) -> Vec<usize> {
    let mut v = Vec::new();
    if let Some(&t) = ix.by_uid.get(&st.st_uid) {
        v.push(t);
    }
    if let Some(&t) = ix.by_gid.get(&st.st_gid) {
        v.push(t);
    }
    if let Some(a) = acl {
        for e in &a.entries {
            let t = match e.tag {
                ACL_USER => ix.by_uid.get(&e.id),
                ACL_GROUP => ix.by_gid.get(&e.id),
                _ => None,
            };
            if let Some(&t) = t {
                v.push(t);
            }
        }
    }
    v.sort_unstable();
    v.dedup();
    v
}

fn who_name(ix: &Index, w: Who) -> String {
    match w {
        Who::Others => "others".into(),
        Who::Tenant(t) => format!("tenant {}", ix.names[t]),
    }
}

fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::RootDir | Component::Prefix(_) => out = PathBuf::from("/"),
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
        }
    }
    out
}

/// Evaluates one entry. Returns the context for its children when it is a directory.
#[allow(clippy::too_many_arguments)]
fn check_entry(
    ix: &Index,
    ctx: &Ctx,
    path: &Path,
    st: &Stat,
    acl: Option<&Acl>,
    default_acl: Option<&Acl>,
    link_target: Option<&Path>,
    out: &mut Vec<Finding>,
) -> Option<Ctx> {
    let ft = FileType::from_raw_mode(st.st_mode);
    let is_dir = ft == FileType::Directory;
    let mut tenant = ctx.tenant;
    let mut tree_root = ctx.tree_root.clone();
    if tenant.is_none() && is_dir {
        if let Some(&t) = ix.by_gid.get(&st.st_gid) {
            tenant = Some(t);
            tree_root = Some(Arc::new(path.to_path_buf()));
        }
    }
    let tname = tenant.map(|t| ix.names[t].clone());
    let mut push = |rule: Rule, who: String, perms: String, detail: String| {
        out.push(Finding {
            rule,
            path: path.to_path_buf(),
            tenant: tname.clone(),
            who,
            perms,
            detail,
        });
    };
    let mentioned = tenants_mentioned(ix, st, acl);
    let meta = Meta { st, acl };
    let mode = st.st_mode & 0o7777;
    if ft == FileType::Symlink {
        if let (Some(root), Some(target)) = (&tree_root, link_target) {
            let base = path.parent().unwrap_or(Path::new("/"));
            let resolved = normalize(&base.join(target));
            if !resolved.starts_with(root.as_path()) {
                push(
                    Rule::SymlinkOutOfTree,
                    String::new(),
                    String::new(),
                    format!("-> {} (tree {})", target.display(), root.display()),
                );
            }
        }
        return None;
    }
    if let Some(t) = tenant {
        let mut whos = vec![Who::Others];
        whos.extend(
            mentioned
                .iter()
                .copied()
                .chain(ctx.reach.iter().map(|(i, _)| *i))
                .filter(|&i| i != t)
                .map(Who::Tenant),
        );
        whos.dedup();
        let mut seen = Vec::new();
        for w in whos {
            if seen.contains(&w) {
                continue;
            }
            seen.push(w);
            let reach = match w {
                Who::Others => ctx.reach_others,
                Who::Tenant(i) => ctx.reach_of(i),
            };
            let p = access(ix, &meta, w);
            if reach && p != 0 {
                let how = if acl.is_some() {
                    format!("mode {mode:04o} + ACL")
                } else {
                    format!("mode {mode:04o}")
                };
                push(
                    Rule::Exposed,
                    who_name(ix, w),
                    perm_str(p),
                    format!("{how}, owner {}:{}", st.st_uid, st.st_gid),
                );
            }
        }
        if let Some(&g) = ix.by_gid.get(&st.st_gid) {
            if g != t {
                push(
                    Rule::ForeignGroup,
                    who_name(ix, Who::Tenant(g)),
                    String::new(),
                    format!("group {} belongs to tenant {}", st.st_gid, ix.names[g]),
                );
            }
        }
        if let Some(&u) = ix.by_uid.get(&st.st_uid) {
            if u != t {
                push(
                    Rule::ForeignOwner,
                    who_name(ix, Who::Tenant(u)),
                    String::new(),
                    format!("owner {} belongs to tenant {}", st.st_uid, ix.names[u]),
                );
            }
        }
        if let Some(d) = default_acl {
            for e in &d.entries {
                let (kind, owner) = match e.tag {
                    ACL_USER => ("user", ix.by_uid.get(&e.id)),
                    ACL_GROUP => ("group", ix.by_gid.get(&e.id)),
                    _ => continue,
                };
                if let Some(&o) = owner {
                    if o != t && e.perm != 0 {
                        push(
                            Rule::DefaultAclGrant,
                            who_name(ix, Who::Tenant(o)),
                            perm_str(e.perm),
                            format!("default:{kind}:{}:{}", e.id, perm_str(e.perm)),
                        );
                    }
                }
            }
        }
    }
    if is_dir && mode & 0o002 != 0 && mode & 0o1000 == 0 && ctx.reach_others {
        push(
            Rule::WorldWritableNoSticky,
            "others".into(),
            perm_str((mode & 7) as u8),
            format!("mode {mode:04o}"),
        );
    }
    if ft == FileType::RegularFile && mode & 0o6000 != 0 {
        let kind = if mode & 0o4000 != 0 {
            "setuid"
        } else {
            "setgid"
        };
        push(
            Rule::SetId,
            String::new(),
            String::new(),
            format!("{kind} mode {mode:04o}, owner {}:{}", st.st_uid, st.st_gid),
        );
    }
    if !is_dir {
        return None;
    }
    let x = |w| access(ix, &meta, w) & 1 != 0;
    let mut reach = Vec::new();
    for i in ctx
        .reach
        .iter()
        .map(|(i, _)| *i)
        .chain(mentioned.iter().copied())
    {
        if reach.iter().any(|(j, _)| *j == i) {
            continue;
        }
        reach.push((i, ctx.reach_of(i) && x(Who::Tenant(i))));
    }
    Some(Ctx {
        tenant,
        tree_root,
        reach_others: ctx.reach_others && x(Who::Others),
        reach,
    })
}

static NO_GETXATTRAT: AtomicBool = AtomicBool::new(false);

/// `getxattrat(dirfd, name, AT_SYMLINK_NOFOLLOW, ...)` (Linux >= 6.13); ENOSYS on older kernels.
fn getxattrat(dir: &OwnedFd, name: &CStr, attr: &CStr, buf: &mut [u8]) -> Result<usize, Errno> {
    #[repr(C)]
    struct XattrArgs {
        value: u64,
        size: u32,
        flags: u32,
    }
    let mut args = XattrArgs {
        value: buf.as_mut_ptr() as u64,
        size: buf.len() as u32,
        flags: 0,
    };
    // SAFETY: the kernel writes at most `size` bytes to `value`, a live buffer; args is repr(C)
    // struct xattr_args, passed with its size.
    let r = unsafe {
        libc::syscall(
            464, // __NR_getxattrat (same number on all architectures)
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            attr.as_ptr(),
            &mut args as *mut XattrArgs,
            std::mem::size_of::<XattrArgs>(),
        )
    };
    if r < 0 {
        Err(Errno::from_raw_os_error(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        ))
    } else {
        Ok(r as usize)
    }
}

fn read_acl_at(dir: &OwnedFd, name: &CStr, which: &str) -> Result<Option<Acl>, String> {
    if !NO_GETXATTRAT.load(Ordering::Relaxed) {
        let attr = if which == ACCESS_XATTR {
            c"system.posix_acl_access"
        } else {
            c"system.posix_acl_default"
        };
        match read_acl(|buf| getxattrat(dir, name, attr, buf), which) {
            Err(e) if e.contains(&Errno::NOSYS.to_string()) => {
                NO_GETXATTRAT.store(true, Ordering::Relaxed)
            }
            r => return r,
        }
    }
    let mut p = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
    p.extend_from_slice(name.to_bytes());
    let p = std::ffi::OsStr::from_bytes(&p);
    read_acl(|buf| rfs::lgetxattr(Path::new(p), which, buf), which)
}

fn read_acl(
    get: impl Fn(&mut [u8]) -> Result<usize, Errno>,
    which: &str,
) -> Result<Option<Acl>, String> {
    let mut buf = [0u8; 1024];
    match get(&mut buf) {
        Ok(n) => Acl::parse(&buf[..n]).map(Some),
        Err(Errno::NODATA) | Err(Errno::NOTSUP) => Ok(None),
        Err(Errno::RANGE) => {
            let mut big = vec![0u8; 65536];
            let n = get(&mut big).map_err(|e| format!("{which}: {e}"))?;
            Acl::parse(&big[..n]).map(Some)
        }
        Err(e) => Err(format!("{which}: {e}")),
    }
}

const ACCESS_XATTR: &str = "system.posix_acl_access";
const DEFAULT_XATTR: &str = "system.posix_acl_default";

struct Walker<'a> {
    ix: &'a Index,
    root_fd: OwnedFd,
    root_path: PathBuf,
    dev: u64,
    scanned: &'a AtomicU64,
    nfound: &'a AtomicU64,
    findings: Mutex<Vec<Finding>>,
    errors: Mutex<Vec<String>>,
}

impl Walker<'_> {
    fn err(&self, path: &Path, msg: impl std::fmt::Display) {
        self.errors
            .lock()
            .unwrap()
            .push(format!("{}: {msg}", path.display()));
    }

    fn walk_dir<'s>(&'s self, scope: &rayon::Scope<'s>, rel: PathBuf, ctx: Ctx) {
        let path = self.root_path.join(&rel);
        let rel_arg: &Path = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            &rel
        };
        let dir = match open_beneath_same_fs(&self.root_fd, rel_arg) {
            Ok(d) => d,
            Err(e) => return self.err(&path, format!("open: {e} (not audited)")),
        };
        let reader = match rfs::Dir::read_from(&dir) {
            Ok(r) => r,
            Err(e) => return self.err(&path, format!("readdir: {e}")),
        };
        let mut local = Vec::new();
        for ent in reader {
            let ent = match ent {
                Ok(e) => e,
                Err(e) => {
                    self.err(&path, format!("readdir: {e}"));
                    break;
                }
            };
            let name = ent.file_name();
            if name.to_bytes() == b"." || name.to_bytes() == b".." {
                continue;
            }
            self.scanned.fetch_add(1, Ordering::Relaxed);
            let cpath = path.join(std::ffi::OsStr::from_bytes(name.to_bytes()));
            let st = match rfs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(s) => s,
                Err(Errno::NOENT) => continue,
                Err(e) => {
                    self.err(&cpath, format!("stat: {e}"));
                    continue;
                }
            };
            let ft = FileType::from_raw_mode(st.st_mode);
            let (mut acl, mut dacl, mut target) = (None, None, None);
            if ft == FileType::Symlink {
                target = rfs::readlinkat(&dir, name, Vec::new())
                    .ok()
                    .map(|t| PathBuf::from(std::ffi::OsStr::from_bytes(t.to_bytes())));
            } else {
                match read_acl_at(&dir, name, ACCESS_XATTR) {
                    Ok(a) => acl = a,
                    Err(e) => self.err(&cpath, e),
                }
                if ft == FileType::Directory {
                    match read_acl_at(&dir, name, DEFAULT_XATTR) {
                        Ok(a) => dacl = a,
                        Err(e) => self.err(&cpath, e),
                    }
                }
            }
            let before = local.len();
            let child = check_entry(
                self.ix,
                &ctx,
                &cpath,
                &st,
                acl.as_ref(),
                dacl.as_ref(),
                target.as_deref(),
                &mut local,
            );
            self.nfound
                .fetch_add((local.len() - before) as u64, Ordering::Relaxed);
            if let Some(child) = child {
                if st.st_dev == self.dev {
                    let crel = rel.join(std::ffi::OsStr::from_bytes(name.to_bytes()));
                    scope.spawn(move |s| self.walk_dir(s, crel, child));
                } else {
                    // Another file system (a mount, a btrfs subvolume a user made): said, not
                    // passed over in silence, so a clean report never hides it.
                    self.err(
                        &cpath,
                        "another file system mounted here (not audited; audit it as its own PATH)",
                    );
                }
            }
        }
        if !local.is_empty() {
            self.findings.lock().unwrap().extend(local);
        }
    }
}

/// Ancestor context of `path`: tenant tree and reachability from `/`.
fn ancestor_ctx(ix: &Index, path: &Path) -> Ctx {
    let mut ctx = Ctx::top();
    let mut sink = Vec::new();
    let mut cur = PathBuf::from("/");
    let ancestors: Vec<_> = path
        .parent()
        .map(|p| p.components().collect())
        .unwrap_or_default();
    for c in ancestors {
        if let Component::Normal(n) = c {
            cur.push(n);
        }
        let Ok(st) = rfs::lstat(&cur) else { break };
        let acl = read_acl(|b| rfs::lgetxattr(&cur, ACCESS_XATTR, b), ACCESS_XATTR)
            .ok()
            .flatten();
        if let Some(next) = check_entry(ix, &ctx, &cur, &st, acl.as_ref(), None, None, &mut sink) {
            ctx = next;
        }
    }
    ctx
}

/// Audits `paths` (with `progress`, a line on stderr that counts entries and findings).
pub fn audit_paths(
    paths: &[PathBuf],
    map: &TenantMap,
    threads: Option<usize>,
    progress: bool,
) -> anyhow::Result<Report> {
    let ix = Index::new(map)?;
    let mut builder = rayon::ThreadPoolBuilder::new();
    if let Some(n) = threads {
        builder = builder.num_threads(n.max(1));
    }
    let pool = builder.build().context("building the walker thread pool")?;
    let scanned = AtomicU64::new(0);
    let nfound = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let mut report = Report::default();
    std::thread::scope(|ts| -> anyhow::Result<()> {
        if progress {
            ts.spawn(|| {
                let mut err = std::io::stderr();
                while !done.load(Ordering::Relaxed) {
                    let _ = write!(
                        err,
                        "\rstorage-audit: {} entries scanned, {} findings",
                        scanned.load(Ordering::Relaxed),
                        nfound.load(Ordering::Relaxed)
                    );
                    let _ = err.flush();
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
                let _ = write!(err, "\r\x1b[2K");
            });
        }
        let r = (|| {
            for p in paths {
                let abs = if p.is_absolute() {
                    p.clone()
                } else {
                    std::env::current_dir()?.join(p)
                };
                let abs = normalize(&abs);
                let st = rfs::lstat(&abs)
                    .with_context(|| format!("storage-audit: cannot stat {}", abs.display()))?;
                if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
                    bail!(
                        "storage-audit: {} is not a directory (symlinks are not followed)",
                        abs.display()
                    );
                }
                let fd = rfs::open(&abs, DIR_FLAGS, Mode::empty())
                    .with_context(|| format!("storage-audit: cannot open {}", abs.display()))?;
                let st = rfs::fstat(&fd)?;
                let pctx = ancestor_ctx(&ix, &abs);
                let acl = read_acl(|b| rfs::fgetxattr(&fd, ACCESS_XATTR, b), ACCESS_XATTR)
                    .ok()
                    .flatten();
                let dacl = read_acl(|b| rfs::fgetxattr(&fd, DEFAULT_XATTR, b), DEFAULT_XATTR)
                    .ok()
                    .flatten();
                let mut top = Vec::new();
                scanned.fetch_add(1, Ordering::Relaxed);
                let ctx = check_entry(
                    &ix,
                    &pctx,
                    &abs,
                    &st,
                    acl.as_ref(),
                    dacl.as_ref(),
                    None,
                    &mut top,
                )
                .expect("a directory");
                let w = Walker {
                    ix: &ix,
                    root_fd: fd,
                    root_path: abs.clone(),
                    dev: st.st_dev,
                    scanned: &scanned,
                    nfound: &nfound,
                    findings: Mutex::new(top),
                    errors: Mutex::new(vec![]),
                };
                pool.scope(|s| w.walk_dir(s, PathBuf::new(), ctx));
                report.findings.extend(w.findings.into_inner().unwrap());
                report.errors.extend(w.errors.into_inner().unwrap());
            }
            Ok(())
        })();
        done.store(true, Ordering::Relaxed);
        r
    })?;
    report.scanned = scanned.load(Ordering::Relaxed);
    report.findings.extend(encryption::unencrypted(paths, map));
    report
        .findings
        .sort_by(|a, b| (&a.path, a.rule, &a.who).cmp(&(&b.path, b.rule, &b.who)));
    report.errors.sort();
    Ok(report)
}

/// A path as JSON text whatever its bytes: UTF-8 as is, other bytes (and a backslash, so the
/// form is reversible) as `\xNN`.
mod lossless_path {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    use std::path::{Path, PathBuf};

    pub fn serialize<S: Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
        let mut out = String::new();
        for chunk in p.as_os_str().as_bytes().utf8_chunks() {
            out.push_str(&chunk.valid().replace('\\', "\\x5c"));
            for b in chunk.invalid() {
                out.push_str(&format!("\\x{b:02x}"));
            }
        }
        s.serialize_str(&out)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<PathBuf, D::Error> {
        let text = String::deserialize(d)?;
        let mut bytes = Vec::with_capacity(text.len());
        let mut rest = text.as_bytes();
        while let Some((&b, tail)) = rest.split_first() {
            let hex = tail
                .get(1..3)
                .filter(|_| b == b'\\' && tail.first() == Some(&b'x'))
                .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
            match hex {
                Some(v) => {
                    bytes.push(v);
                    rest = &tail[3..];
                }
                None => {
                    bytes.push(b);
                    rest = tail;
                }
            }
        }
        Ok(PathBuf::from(std::ffi::OsString::from_vec(bytes)))
    }
}
