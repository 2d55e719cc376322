//! This repository's backend labels as the kit's [`Deployment`]: the conformance
//! suite's URL for the label (a fresh SQLite file per run), the label's rules, the
//! nemeses that apply to it, and its servers' faults ([`Servers`]).

use std::sync::Arc;

use async_trait::async_trait;
use dlock_tck::lockcheck::{Deployment, Nemesis, ServerFaults};

use crate::backends::{self, TestUrl};
use crate::TestBackend;

use super::broken::{in_process, Flaw};
use super::check::Rules;
use super::rules_for;
use super::servers::{not_applicable, Servers};

/// A backend label of this repository (`backends::KNOWN`, or a broken in-process
/// backend of [`Flaw::ALL`]) under the lock-history checker.
pub struct LabelDeployment {
    label: String,
    /// `None` for the in-process stores; owns a per-run SQLite file.
    url: Option<TestUrl>,
}

impl LabelDeployment {
    /// The deployment of `label` at the conformance suite's URL
    /// ([`backends::server_url`]); an unknown label is an error naming the known.
    pub fn new(label: &str) -> Result<Self, String> {
        let url = if in_process(label) {
            None
        } else {
            Some(backends::server_url(label).ok_or_else(|| {
                let broken: Vec<&str> = Flaw::ALL.iter().map(|(l, _)| *l).collect();
                format!(
                    "unknown backend {label:?}; known: {}, {}",
                    backends::KNOWN.join(", "),
                    broken.join(", ")
                )
            })?)
        };
        Ok(LabelDeployment {
            label: label.to_owned(),
            url,
        })
    }

    /// The deployment of `label` in a worker process: the URL its coordinator
    /// gave it (`DLOCK_LOCKCHECK_URL`), which it opens through its proxies.
    pub fn worker(label: &str) -> Self {
        let url = std::env::var(dlock_tck::lockcheck::procs::WORKER_URL_VAR)
            .ok()
            .filter(|url| !url.is_empty())
            .map(TestUrl::fixed);
        LabelDeployment {
            label: label.to_owned(),
            url,
        }
    }
}

#[async_trait]
impl Deployment for LabelDeployment {
    fn label(&self) -> String {
        self.label.clone()
    }

    fn url(&self) -> Option<String> {
        self.url.as_ref().map(ToString::to_string)
    }

    async fn open(&self, url: &str) -> Result<Arc<dyn TestBackend>, String> {
        backends::open_at(&self.label, TestUrl::fixed(url))
            .await
            .map_err(|e| e.to_string())
    }

    fn rules(&self) -> Rules {
        rules_for(&self.label)
    }

    fn not_applicable(&self, kind: Nemesis) -> Option<String> {
        not_applicable(kind, &self.label)
    }

    fn resets_end_sessions(&self) -> bool {
        backends::is_session_mode(&self.label)
    }

    /// ZooKeeper: a killed worker's holds live until its session expires (the
    /// test servers' 5 s bound), taking its permits and its place in every
    /// queue out of use that long.
    fn kills_linger(&self) -> bool {
        self.label.starts_with("zk")
    }

    fn servers(&self) -> Result<Option<Box<dyn ServerFaults>>, String> {
        let Some(url) = &self.url else {
            return Ok(None);
        };
        Ok(Some(Box::new(Servers::new(&self.label, &url.to_string())?)))
    }
}
