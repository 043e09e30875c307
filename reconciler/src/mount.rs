//! The credentials Secret and cloud-config ConfigMap as this process loaded them from their
//! volumes, compared with the objects in the API.
//!
//! The kubelet refreshes a Secret or ConfigMap volume a minute or two after the object changes,
//! so a process that reads its files right after a rotation can read the old ones. Two rules keep
//! a replica from running on stale credentials: it campaigns (and, once elected, builds its
//! provider) only while its mounted files equal the objects' data; and the change detector's
//! baseline is the files it loaded, not the first object it sees from the API, so a rotation that
//! landed between the load and the watch still ends the run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::PoisonError;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::ListParams;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

/// How long reading the two objects may take, retries included.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The retries' first and longest delays.
const READ_RETRY_MIN: Duration = Duration::from_millis(100);
const READ_RETRY_MAX: Duration = Duration::from_secs(1);

/// Files of a volume: name → content.
pub(crate) type Files = BTreeMap<String, Vec<u8>>;

/// The regular files of a Secret or ConfigMap volume at `dir`, by name, without the kubelet's
/// `..data` links and timestamped directories; empty when `dir` is absent.
pub(crate) fn read_files(dir: &Path) -> Files {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Files::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            if name.starts_with("..") {
                return None;
            }
            // Follows the kubelet's symlinks; a directory is not a key.
            let content = std::fs::read(entry.path()).ok()?;
            Some((name, content))
        })
        .collect()
}

/// The data of `secret` as its volume would hold it.
pub(crate) fn secret_files(secret: &Secret) -> Files {
    secret
        .data
        .iter()
        .flatten()
        .map(|(key, value)| (key.clone(), value.0.clone()))
        .collect()
}

/// The data of `configmap` as its volume would hold it.
pub(crate) fn configmap_files(configmap: &ConfigMap) -> Files {
    let text = configmap
        .data
        .iter()
        .flatten()
        .map(|(key, value)| (key.clone(), value.clone().into_bytes()));
    let binary = configmap
        .binary_data
        .iter()
        .flatten()
        .map(|(key, value)| (key.clone(), value.0.clone()));
    text.chain(binary).collect()
}

/// Where the objects live and where they are mounted.
#[derive(Clone, Debug)]
pub struct Mounts {
    /// Namespace of both objects.
    pub(crate) namespace: String,
    /// The credentials Secret's name.
    pub(crate) secret: String,
    /// Where it is mounted.
    pub(crate) secret_dir: PathBuf,
    /// The cloud-config ConfigMap's name (optional object).
    pub(crate) configmap: String,
    /// Where it is mounted.
    pub(crate) configmap_dir: PathBuf,
}

/// What this process loaded: the files of both volumes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    /// The Secret's volume.
    pub(crate) secret: Files,
    /// The ConfigMap's volume.
    pub(crate) configmap: Files,
}

impl Loaded {
    /// Reads both volumes now.
    pub(crate) fn read(mounts: &Mounts) -> Self {
        Self {
            secret: read_files(&mounts.secret_dir),
            configmap: read_files(&mounts.configmap_dir),
        }
    }
}

/// How the mounted files compare with the objects in the API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Freshness {
    /// Every object that exists matches its volume.
    Current,
    /// This object's volume differs from it: the kubelet has not refreshed it yet.
    Stale(String),
    /// The objects could not be read; nothing to compare with.
    Unknown(String),
}

/// Compares `loaded` with the objects' data (an object that does not exist, such as the optional
/// ConfigMap, has nothing to compare).
pub(crate) fn compare(
    loaded: &Loaded,
    secret: Option<&Secret>,
    configmap: Option<&ConfigMap>,
) -> Freshness {
    if let Some(secret) = secret
        && secret_files(secret) != loaded.secret
    {
        return Freshness::Stale(format!(
            "Secret {}",
            secret.metadata.name.as_deref().unwrap_or_default()
        ));
    }
    if let Some(configmap) = configmap
        && configmap_files(configmap) != loaded.configmap
    {
        return Freshness::Stale(format!(
            "ConfigMap {}",
            configmap.metadata.name.as_deref().unwrap_or_default()
        ));
    }
    Freshness::Current
}

/// Reads the objects, then the volumes, now and compares them; also returns the files read.
pub(crate) async fn freshness(client: &Client, mounts: &Mounts) -> (Freshness, Loaded) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &mounts.namespace);
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &mounts.namespace);
    let objects = || async {
        let secret = named(&secrets, &mounts.secret)
            .await
            .map_err(|e| ReadError::new(format!("Secret {}", mounts.secret), &e))?;
        let configmap = named(&configmaps, &mounts.configmap)
            .await
            .map_err(|e| ReadError::new(format!("ConfigMap {}", mounts.configmap), &e))?;
        Ok::<_, ReadError>((secret, configmap))
    };
    // Transient errors (an apiserver answering 500 while it starts or under load) are retried
    // within a bound: one must not let a replica with stale files campaign, and an apiserver cut
    // off by a partition must not hold up the campaign for longer than the bound.
    let last_error = std::sync::Mutex::new(None::<String>);
    let retried = objects
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(READ_RETRY_MIN)
                .with_max_delay(READ_RETRY_MAX)
                .without_max_times(),
        )
        .when(|e: &ReadError| e.transient)
        .notify(|e: &ReadError, _| {
            *last_error.lock().unwrap_or_else(PoisonError::into_inner) = Some(e.message.clone());
        });
    let objects = tokio::time::timeout(READ_TIMEOUT, retried)
        .await
        .unwrap_or_else(|_| {
            let last = last_error
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            Err(ReadError {
                message: last
                    .unwrap_or_else(|| format!("reading Secret {} timed out", mounts.secret)),
                transient: true,
            })
        });
    let loaded = Loaded::read(mounts);
    let freshness = match objects {
        Ok((secret, configmap)) => compare(&loaded, secret.as_ref(), configmap.as_ref()),
        Err(error) => Freshness::Unknown(error.message),
    };
    (freshness, loaded)
}

/// A failed read of one of the two objects.
struct ReadError {
    message: String,
    /// Worth retrying: the apiserver could not answer now, rather than refused.
    transient: bool,
}

impl ReadError {
    fn new(object: String, error: &kube::Error) -> Self {
        let transient = match error {
            kube::Error::Api(status) => status.code >= 500 || status.code == 429,
            kube::Error::HyperError(_) | kube::Error::Service(_) => true,
            _ => false,
        };
        Self {
            message: format!("reading {object}: {error}"),
            transient,
        }
    }
}

/// Object `name`, listed by name as the watch does (the role grants list and watch of these two
/// objects by name, not get).
async fn named<K>(api: &Api<K>, name: &str) -> Result<Option<K>, kube::Error>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let params = ListParams::default().fields(&format!("metadata.name={name}"));
    Ok(api.list(&params).await?.items.into_iter().next())
}

/// What a change is measured against.
#[derive(Clone, Debug)]
pub(crate) enum Baseline {
    /// The files the provider was built from.
    Loaded(Loaded),
    /// The first version of each object seen (a platform that reads no files).
    FirstSeen,
}

/// Resolves when the Secret's or the ConfigMap's data differs from `baseline`, as the API shows
/// the objects or as their mounted files show them (read every `poll`): the process runs on
/// files that are no longer the objects', so it should drain and restart.
///
/// The files are read as well as the objects watched because the objects may not be readable
/// through this API at all: on a hosted control plane the credentials are mounted from the
/// management cluster, and the guest API the controller talks to has no objects of those names.
pub(crate) async fn changed(client: Client, mounts: &Mounts, baseline: Baseline, poll: Duration) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &mounts.namespace);
    let configmaps: Api<ConfigMap> = Api::namespaced(client, &mounts.namespace);
    let (secret_base, configmap_base, loaded) = match baseline {
        Baseline::Loaded(loaded) => (
            Some(loaded.secret.clone()),
            Some(loaded.configmap.clone()),
            Some(loaded),
        ),
        Baseline::FirstSeen => (None, None, None),
    };
    let secret = &mounts.secret;
    let configmap = &mounts.configmap;
    let files = async {
        match loaded {
            Some(loaded) => files_changed(mounts, loaded, poll).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = first_change(secrets, secret, secret_files, secret_base) => {
            tracing::info!(%secret, "credentials Secret changed");
        }
        () = first_change(configmaps, configmap, configmap_files, configmap_base) => {
            tracing::info!(%configmap, "cloud config ConfigMap changed");
        }
        dir = files => {
            tracing::info!(dir = %dir.display(), "mounted credentials or cloud config changed on disk");
        }
    }
}

/// How long a changed volume must read the same before the change counts: a writer that is not
/// the kubelet (whose swap is atomic) may be halfway through.
const SETTLE: Duration = Duration::from_secs(1);

/// Resolves with the changed volume's directory once the files read differ from `loaded` and
/// read the same again [`SETTLE`] later. A read costs a few small files and no cloud call.
async fn files_changed(mounts: &Mounts, loaded: Loaded, poll: Duration) -> PathBuf {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + poll, poll);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let now = Loaded::read(mounts);
        if now == loaded {
            continue;
        }
        tokio::time::sleep(SETTLE).await;
        if Loaded::read(mounts) != now {
            continue;
        }
        return if now.secret == loaded.secret {
            mounts.configmap_dir.clone()
        } else {
            mounts.secret_dir.clone()
        };
    }
}

async fn first_change<K, F>(api: Api<K>, name: &str, files: F, mut seen: Option<Files>)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    F: Fn(&K) -> Files,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let stream = watcher::watcher(api, config)
        .backoff(cloudnet_kubeclient::watch_backoff())
        .applied_objects();
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        let Ok(object) = event else { continue };
        let now = files(&object);
        match &seen {
            Some(before) if *before != now => return,
            _ => seen = Some(now),
        }
    }
    std::future::pending::<()>().await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use k8s_openapi::ByteString;
    use kube::api::ObjectMeta;

    use super::*;

    fn secret(key: &[u8]) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("cloud-credentials".into()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(
                "aws_access_key_id".to_owned(),
                ByteString(key.to_vec()),
            )])),
            ..Secret::default()
        }
    }

    #[test]
    fn a_volume_is_read_as_the_kubelet_lays_it_out() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("..2026_01_01_00_00_00.1");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("aws_access_key_id"), b"AKIDNEW").unwrap();
        std::os::unix::fs::symlink(&data, dir.path().join("..data")).unwrap();
        std::os::unix::fs::symlink(
            dir.path().join("..data/aws_access_key_id"),
            dir.path().join("aws_access_key_id"),
        )
        .unwrap();
        let files = read_files(dir.path());
        assert_eq!(
            files,
            BTreeMap::from([("aws_access_key_id".to_owned(), b"AKIDNEW".to_vec())])
        );
        assert!(read_files(&dir.path().join("absent")).is_empty());
    }

    #[test]
    fn stale_files_are_told_from_current_ones_and_absent_objects_compare_nothing() {
        let loaded = Loaded {
            secret: secret_files(&secret(b"AKIDOLD")),
            configmap: Files::new(),
        };
        assert_eq!(
            compare(&loaded, Some(&secret(b"AKIDOLD")), None),
            Freshness::Current
        );
        assert_eq!(
            compare(&loaded, Some(&secret(b"AKIDNEW")), None),
            Freshness::Stale("Secret cloud-credentials".into())
        );
        assert_eq!(compare(&loaded, None, None), Freshness::Current);
        let configmap = ConfigMap {
            metadata: ObjectMeta {
                name: Some("kube-cloud-config".into()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(
                "ca-bundle.pem".to_owned(),
                "x".to_owned(),
            )])),
            ..ConfigMap::default()
        };
        assert_eq!(
            compare(&loaded, Some(&secret(b"AKIDOLD")), Some(&configmap)),
            Freshness::Stale("ConfigMap kube-cloud-config".into())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_changed_file_is_noticed_at_the_next_read_and_an_unchanged_one_never() {
        let dir = tempfile::tempdir().unwrap();
        let (secret_dir, configmap_dir) = (dir.path().join("secret"), dir.path().join("config"));
        std::fs::create_dir_all(&secret_dir).unwrap();
        std::fs::write(secret_dir.join("aws_access_key_id"), b"AKIDOLD").unwrap();
        let mounts = Mounts {
            namespace: "ns".into(),
            secret: "s".into(),
            secret_dir: secret_dir.clone(),
            configmap: "c".into(),
            configmap_dir: configmap_dir.clone(),
        };
        let loaded = Loaded::read(&mounts);
        let poll = Duration::from_secs(30);
        let unchanged = tokio::time::timeout(
            Duration::from_secs(300),
            files_changed(&mounts, loaded.clone(), poll),
        );
        assert!(
            unchanged.await.is_err(),
            "unchanged files reported as changed"
        );
        std::fs::create_dir_all(&configmap_dir).unwrap();
        std::fs::write(configmap_dir.join("ca-bundle.pem"), b"new CA").unwrap();
        let changed = tokio::time::timeout(poll * 2, files_changed(&mounts, loaded, poll));
        assert_eq!(changed.await.unwrap(), configmap_dir);
    }

    #[test]
    fn only_an_apiserver_that_could_not_answer_is_read_again() {
        let status = |code| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                ..kube::core::Status::default()
            }))
        };
        let transient = |e| ReadError::new("Secret s".into(), &e).transient;
        assert!(transient(status(500)));
        assert!(transient(status(503)));
        assert!(transient(status(429)));
        assert!(!transient(status(403)), "a refusal is not retried");
        assert!(!transient(status(404)));
    }
}
