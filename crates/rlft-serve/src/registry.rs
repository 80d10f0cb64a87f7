//! The models a server answers to, by name: the base model and LoRA adapters on it (PEFT
//! directories), which can be loaded and unloaded while it runs.
//!
//! An adapter is a copy of the base network that shares every base weight (no data copied)
//! with the adapter's `A`/`B` factors attached ([`rlft_model::peft::load_adapter`]). Requests
//! hold their model, so unloading or replacing an adapter never disturbs the requests already
//! decoding with it: they finish on the weights they started with.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rlft_model::{decode_fast, LoadedModel};

use crate::engine::ServedModel;

/// Why a model could not be added or removed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The base model cannot run on the fused decode path.
    #[error(
        "rlft serve decodes f32 weights on the CPU (continuous batching runs on the fused CPU \
         decoder); load the model with --dtype f32 --device cpu"
    )]
    Unsupported,
    /// The name is taken.
    #[error(
        "the name `{0}` is already served; unload it first, pick another lora_name, or pass \
         \"load_inplace\": true to replace the adapter"
    )]
    Exists(String),
    /// The name is the base model's, which cannot be replaced or removed.
    #[error("`{0}` is the base model; it cannot be replaced or unloaded")]
    Base(String),
    /// No adapter has this name.
    #[error("no LoRA adapter is loaded under the name `{0}`")]
    NotFound(String),
    /// An empty name.
    #[error("lora_name is empty; give the adapter a name requests can use as `model`")]
    EmptyName,
    /// Reading the adapter failed.
    #[error("cannot load the LoRA adapter `{name}` from {}: {source}", path.display())]
    Load {
        /// Adapter name.
        name: String,
        /// Its directory.
        path: PathBuf,
        /// What went wrong.
        source: Box<rlft_model::ModelError>,
    },
}

/// The served models.
#[derive(Debug)]
pub struct Registry {
    base: Arc<ServedModel>,
    adapters: RwLock<Vec<Arc<ServedModel>>>,
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Registry {
    /// Serves `loaded` under `name`.
    pub fn new(loaded: LoadedModel, name: &str) -> Result<Registry, RegistryError> {
        if !decode_fast::supported(&loaded.model) {
            return Err(RegistryError::Unsupported);
        }
        let g = &loaded.generation;
        let defaults = if g.do_sample {
            g.sampling.clone()
        } else {
            rlft_model::SamplingParams::default()
        };
        // A missing or broken template is reported when a chat request needs it.
        let template = loaded
            .text
            .compile_chat_template()
            .map(Arc::new)
            .map_err(|e| e.to_string());
        let base = ServedModel {
            name: name.to_string(),
            model: loaded.model,
            text: Arc::new(loaded.text),
            template,
            eos_token_ids: g.eos_token_ids.clone(),
            defaults,
            parent: None,
            root: loaded.source,
            created: now(),
        };
        Ok(Registry {
            base: Arc::new(base),
            adapters: RwLock::new(Vec::new()),
        })
    }

    /// The base model.
    pub fn base(&self) -> &Arc<ServedModel> {
        &self.base
    }

    /// The model served under `name`.
    pub fn get(&self, name: &str) -> Option<Arc<ServedModel>> {
        if name == self.base.name {
            return Some(self.base.clone());
        }
        let a = self.adapters.read().expect("registry lock");
        a.iter().find(|m| m.name == name).cloned()
    }

    /// Every served model, the base first.
    pub fn list(&self) -> Vec<Arc<ServedModel>> {
        let a = self.adapters.read().expect("registry lock");
        std::iter::once(self.base.clone())
            .chain(a.iter().cloned())
            .collect()
    }

    /// The served names, the base first.
    pub fn names(&self) -> Vec<String> {
        self.list().iter().map(|m| m.name.clone()).collect()
    }

    /// Loads the PEFT adapter directory `path` under `name` (reads files: call it off the
    /// async threads). `replace` swaps an adapter already loaded under that name.
    pub fn load_adapter(
        &self,
        name: &str,
        path: &Path,
        replace: bool,
    ) -> Result<Arc<ServedModel>, RegistryError> {
        self.check_name(name, replace)?;
        let mut model = self.base.model.clone();
        rlft_model::peft::load_adapter(&mut model, path).map_err(|source| RegistryError::Load {
            name: name.to_string(),
            path: path.to_path_buf(),
            source: Box::new(source),
        })?;
        if !decode_fast::supported(&model) {
            return Err(RegistryError::Unsupported);
        }
        let served = Arc::new(ServedModel {
            name: name.to_string(),
            model,
            text: self.base.text.clone(),
            template: self.base.template.clone(),
            eos_token_ids: self.base.eos_token_ids.clone(),
            defaults: self.base.defaults.clone(),
            parent: Some(self.base.name.clone()),
            root: path.to_path_buf(),
            created: now(),
        });
        let mut a = self.adapters.write().expect("registry lock");
        // Checked again under the lock: another load may have taken the name meanwhile.
        if !replace && a.iter().any(|m| m.name == name) {
            return Err(RegistryError::Exists(name.to_string()));
        }
        a.retain(|m| m.name != name);
        a.push(served.clone());
        Ok(served)
    }

    /// Removes the adapter `name`.
    pub fn unload_adapter(&self, name: &str) -> Result<(), RegistryError> {
        if name == self.base.name {
            return Err(RegistryError::Base(name.to_string()));
        }
        let mut a = self.adapters.write().expect("registry lock");
        let before = a.len();
        a.retain(|m| m.name != name);
        if a.len() == before {
            return Err(RegistryError::NotFound(name.to_string()));
        }
        Ok(())
    }

    fn check_name(&self, name: &str, replace: bool) -> Result<(), RegistryError> {
        if name.is_empty() {
            return Err(RegistryError::EmptyName);
        }
        if name == self.base.name {
            return Err(RegistryError::Base(name.to_string()));
        }
        if !replace && self.get(name).is_some() {
            return Err(RegistryError::Exists(name.to_string()));
        }
        Ok(())
    }
}
