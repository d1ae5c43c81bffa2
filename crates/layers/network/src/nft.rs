//! Running the `nft` binary: arguments as a vector and scripts on stdin, never a shell string.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::{Error, Result};

/// Where `nft` is looked for (the Prolog runs without PATH). `TENANCY_NFT` overrides.
const CANDIDATES: &[&str] = &["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft", "/bin/nft"];

pub(crate) fn nft_binary() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("TENANCY_NFT") {
        return Ok(PathBuf::from(p));
    }
    CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::Invalid(format!(
                "nft not found in {CANDIDATES:?}: install the nftables package or set TENANCY_NFT"
            ))
        })
}

/// Where iproute2's `ip` is (tenancyctl may run without PATH, as from a systemd unit).
pub(crate) fn tool(name: &str) -> PathBuf {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|d| PathBuf::from(d).join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

fn finish(action: &str, out: std::process::Output) -> Result<String> {
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::Nft {
            action: action.to_string(),
            status: out
                .status
                .code()
                .map(|c| c.to_string())
                .unwrap_or_else(|| "signal".into()),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// `nft -f -` with `script` on stdin: one atomic transaction.
pub(crate) fn run_script(script: &str, action: &str) -> Result<()> {
    let nft = nft_binary()?;
    let mut child = Command::new(&nft)
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| crate::io_err("cannot run", &nft, e))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let write_res = stdin.write_all(script.as_bytes());
    drop(stdin);
    let out = child
        .wait_with_output()
        .map_err(|e| crate::io_err("cannot wait for", &nft, e))?;
    let res = finish(action, out).map(|_| ());
    match (res, write_res) {
        (Err(e), _) => Err(e),
        (Ok(()), Err(e)) => Err(crate::io_err("cannot write script to", &nft, e)),
        (Ok(()), Ok(())) => Ok(()),
    }
}

pub(crate) fn run_args(args: &[&str], action: &str) -> Result<String> {
    let nft = nft_binary()?;
    let out = Command::new(&nft)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| crate::io_err("cannot run", &nft, e))?;
    finish(action, out)
}

/// (name, packets, bytes) of the counters of `table` in `nft -j list counters` output.
pub(crate) fn parse_counters(json: &str, table: &str) -> Result<Vec<(String, u64, u64)>> {
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| Error::Nft {
        action: "list counters (parse JSON)".into(),
        status: "0".into(),
        stderr: e.to_string(),
    })?;
    let mut out = Vec::new();
    for item in v["nftables"].as_array().into_iter().flatten() {
        let c = &item["counter"];
        if c.is_object() && c["table"] == table && c["family"] == "inet" {
            if let (Some(n), Some(p), Some(b)) = (
                c["name"].as_str(),
                c["packets"].as_u64(),
                c["bytes"].as_u64(),
            ) {
                out.push((n.to_string(), p, b));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_nft_json() {
        let j = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"counter": {"family": "inet", "name": "drop_acme", "table": "tenancy", "handle": 4, "packets": 3, "bytes": 180}}, {"counter": {"family": "inet", "name": "x", "table": "other", "handle": 4, "packets": 1, "bytes": 1}}]}"#;
        let c = super::parse_counters(j, "tenancy").unwrap();
        assert_eq!(c, vec![("drop_acme".to_string(), 3, 180)]);
        assert!(super::parse_counters("nope", "t").is_err());
    }
}
