//! Small driver of the scratch layer for benchmarks and manual checks:
//!   scratchtool wipe --root R --tenant T --tenant-gid G --job N
//!   scratchtool create --root R --tenant T --tenant-gid G --job N [--uid U] [--encrypt]
//!   scratchtool erase --root R --tenant T --tenant-gid G --job N --key ID
//!   scratchtool empty-trash --root R
//!   scratchtool bench-create --root R --tenant T --tenant-gid G [--uid U] [--jobs N] [--encrypt]
//! (create, erase, wipe and empty-trash print the microseconds they took on stderr; bench-create
//! prints each create's, one a line, on stdout.) The storage audit is `tenancyctl storage-audit`.
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use tenancy_scratch::*;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// `--name value` options and `--flag` switches after the command.
struct Args {
    values: HashMap<String, String>,
    flags: Vec<String>,
}

impl Args {
    fn parse(rest: &[String]) -> Result<Args> {
        let (mut values, mut flags) = (HashMap::new(), Vec::new());
        let mut it = rest.iter();
        while let Some(a) = it.next() {
            let name = a
                .strip_prefix("--")
                .ok_or_else(|| format!("unexpected argument {a:?}"))?;
            if name == "encrypt" {
                flags.push(name.to_string());
            } else {
                let v = it.next().ok_or_else(|| format!("--{name} wants a value"))?;
                values.insert(name.to_string(), v.clone());
            }
        }
        Ok(Args { values, flags })
    }
    fn get<T: std::str::FromStr>(&self, name: &str, default: Option<T>) -> Result<T>
    where
        T::Err: std::fmt::Display,
    {
        match self.values.get(name) {
            Some(v) => v.parse().map_err(|e| format!("--{name} {v:?}: {e}").into()),
            None => default.ok_or_else(|| format!("--{name} is required").into()),
        }
    }
    fn flag(&self, name: &str) -> bool {
        self.flags.iter().any(|f| f == name)
    }
    /// The job's folder: --root, --tenant, --tenant-gid and --job (or `job`).
    fn spec(&self, job: Option<u64>, uid: u32) -> Result<ScratchSpec> {
        let tenant_gid = self.get("tenant-gid", None)?;
        Ok(ScratchSpec {
            root: self.get::<PathBuf>("root", None)?,
            tenant: self.get("tenant", None)?,
            tenant_gid,
            job_id: match job {
                Some(j) => j,
                None => self.get("job", None)?,
            },
            uid,
            gid: tenant_gid,
            mode: DEFAULT_JOB_MODE,
            quota: None,
            tenant_groups: Vec::new(),
        })
    }
}

fn timed<T>(f: impl FnOnce() -> T) -> T {
    let t = std::time::Instant::now();
    let r = f();
    eprintln!("{}", t.elapsed().as_micros());
    r
}

fn run(cmd: &str, a: &Args) -> Result<()> {
    match cmd {
        "wipe" => {
            let spec = a.spec(None, 1)?;
            println!("{:?}", timed(|| wipe(&spec))?);
        }
        // The prolog's scratch step (with --encrypt: a fresh key, the policy, the key added).
        "create" => {
            let spec = a.spec(None, a.get("uid", Some(1000))?)?;
            let made = timed(|| -> Result<Created> {
                if a.flag("encrypt") {
                    Ok(create_encrypted(&spec, &JobKey::generate()?, None)?)
                } else {
                    Ok(create(&spec)?)
                }
            })?;
            println!("{}", serde_json::to_string(&made)?);
        }
        // The epilog's step for an encrypted wipe tier: key removed, folder moved to the trash.
        "erase" => {
            let spec = a.spec(None, 1)?;
            let key: KeyId = a.get("key", None)?;
            println!("{:?}", timed(|| erase(&spec, key))?);
        }
        // What the epilog's detached deleter does.
        "empty-trash" => {
            let root: PathBuf = a.get("root", None)?;
            let done = timed(|| trash::empty(&root, true))?;
            println!(
                "removed {} failed {}",
                done.removed.len(),
                done.failed.len()
            );
        }
        // `--jobs` creates and wipes (or creates and erases, trash emptied after each).
        "bench-create" => {
            let (uid, jobs) = (a.get("uid", Some(1000))?, a.get("jobs", Some(200u64))?);
            let root: PathBuf = a.get("root", None)?;
            for job in 0..jobs {
                let spec = a.spec(Some(9_000_000 + job), uid)?;
                let t = std::time::Instant::now();
                let key = if a.flag("encrypt") {
                    let key = JobKey::generate()?;
                    create_encrypted(&spec, &key, None)?;
                    Some(key.id())
                } else {
                    create(&spec)?;
                    None
                };
                println!("{}", t.elapsed().as_micros());
                match key {
                    Some(id) => {
                        erase(&spec, id)?;
                        trash::empty(&root, true)?;
                    }
                    None => {
                        wipe(&spec)?;
                    }
                }
            }
        }
        _ => return Err(format!("unknown command {cmd:?} (see the top of scratchtool.rs)").into()),
    }
    Ok(())
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let Some((cmd, rest)) = argv.split_first() else {
        eprintln!("usage: scratchtool wipe|create|erase|empty-trash|bench-create --root R ...");
        return ExitCode::from(2);
    };
    match Args::parse(rest).and_then(|a| run(cmd, &a)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("scratchtool {cmd}: {e}");
            ExitCode::from(2)
        }
    }
}
