//! The watch: kube-runtime watchers on Services and EndpointSlices (and nodes and pods when
//! asked), joined in [`Cluster`], turned into model events.
//!
//! Each watcher lists, then watches from the list's resource version, and lists again by itself
//! when the API server says the version expired (410 Gone). Nothing is sent until every watcher
//! has listed: the first event is one `Reset` with everything, never a half-synced set. After a
//! re-list of any watcher the whole set is sent again as a `Reset` (the core pushes only what
//! changed). In between, each object change converts only the Services it touches.
//!
//! A transient error (the API server restarting, a dropped connection, a 429 or a 5xx) does not
//! end the watch: the watcher backs off (kube-runtime's default, 0.8 s doubling to 30 s) and
//! resumes from its last resource version, so nothing is listed or sent again. Meanwhile the
//! registry is reported unhealthy (`Retrying`), until the watcher delivers again or a probe
//! ([`crate::outage`]) finds the API server answering (`Recovered`). Only what retrying cannot
//! fix ends the watch (401, 403 naming the verb and resource the adapter lacks, another 4xx):
//! the core keeps serving the last good state, backs off and starts a new watch, which lists
//! everything again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use futures::stream::{self, BoxStream};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod, Service as KubeService};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, watcher as object_watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, ResourceExt};
use mcp_core::problems::ProblemLedger;
use mcp_core::vip::VipCidr;
use mcp_core::{channel_stream, EventSender, Registry, RegistryError, RegistryEvent, Service};

use crate::client::{classify, connect, Activity, ClientError, Failure};
use crate::compact;
use crate::config::KubeConfig;
use crate::convert::{convert_service, Settings};
use crate::outage::{probe, Outage, Probe};
use crate::state::{Cluster, Item, Kind, ObjKey, PodInfo, Topology};

/// Kubernetes as a [`Registry`].
#[derive(Clone)]
pub struct KubeRegistry {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for KubeRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeRegistry")
            .field("namespaces", &self.inner.namespaces)
            .finish_non_exhaustive()
    }
}

struct Inner {
    client: Client,
    namespaces: Vec<String>,
    label_selector: Option<String>,
    read_nodes: bool,
    read_pods: bool,
    watch_timeout: u32,
    settings: Settings,
    /// Problems as the core holds them (it keeps them across watches).
    ledger: Mutex<ProblemLedger>,
}

impl KubeRegistry {
    /// Connects to the cluster the flags name (the connection itself is made by the first watch).
    pub async fn connect(cfg: &KubeConfig) -> Result<Self, ClientError> {
        Ok(Self {
            inner: Arc::new(Inner {
                client: connect(cfg).await?,
                namespaces: cfg.namespaces.clone(),
                label_selector: cfg.label_selector.clone().filter(|s| !s.is_empty()),
                read_nodes: cfg.read_nodes,
                read_pods: cfg.read_pods,
                watch_timeout: u32::try_from(cfg.watch_timeout.as_secs())
                    .unwrap_or(u32::MAX)
                    .max(1),
                settings: Settings::from(cfg),
                ledger: Mutex::new(ProblemLedger::new()),
            }),
        })
    }
}

impl Registry for KubeRegistry {
    const NAME: &'static str = "kubernetes";
    /// Hosts are complete (`<svc>.<ns>.svc.<--cluster-domain>`); no suffix is added.
    const DEFAULT_HOST_SUFFIX: &'static str = "";
    /// ServiceEntries keep their Service's namespace; this is only the fallback.
    const DEFAULT_NAMESPACE: &'static str = "default";
    const DEFAULT_VIP_CIDR: VipCidr = VipCidr::range(242, 5, 0, 0, 16);

    fn watch(&self) -> BoxStream<'static, Result<RegistryEvent, RegistryError>> {
        let inner = Arc::clone(&self.inner);
        channel_stream(move |tx| async move { inner.run(tx).await })
    }
}

/// One watcher: what it lists, where, and its re-list buffer.
struct Source {
    kind: Kind,
    scope: Option<String>,
    activity: Activity,
    /// `Some` between `Init` and `InitDone`.
    buffer: Option<Vec<Item>>,
    listed: bool,
}

type Tagged = (usize, Result<Event<Item>, watcher::Error>);

/// A watcher's objects as [`Item`]s, retried by the watcher with kube-runtime's default backoff
/// after an error (every error is still yielded, so that the loop can say what happened).
fn items<K, S>(s: S, f: fn(K) -> Item) -> BoxStream<'static, Result<Event<Item>, watcher::Error>>
where
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    K: Send + 'static,
{
    s.default_backoff()
        .map(move |r| {
            r.map(|ev| match ev {
                Event::Apply(k) => Event::Apply(f(k)),
                Event::Delete(k) => Event::Delete(f(k)),
                Event::Init => Event::Init,
                Event::InitApply(k) => Event::InitApply(f(k)),
                Event::InitDone => Event::InitDone,
            })
        })
        .boxed()
}

/// What is kept of a Service as the watcher decoded it (public: the fuzz targets feed the
/// API server's JSON through this, as the watch does).
pub fn service_item(s: KubeService) -> Item {
    Item::Service(Box::new(compact::service(s)))
}

/// What is kept of an EndpointSlice as the watcher decoded it (public for the fuzz targets).
pub fn slice_item(s: EndpointSlice) -> Item {
    Item::Slice(Box::new(compact::slice(s)))
}

fn pod_item(p: Pod) -> Item {
    Item::Pod(
        (p.namespace().unwrap_or_default(), p.name_any()),
        PodInfo::of(&p),
    )
}

fn node_item(n: PartialObjectMeta<Node>) -> Item {
    Item::Node(n.name_any(), Topology::of(&n))
}

impl Inner {
    fn api<K>(&self, scope: &Option<String>) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        match scope {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        }
    }

    /// Starts every watcher; their events tagged with the index of their [`Source`], and the
    /// probe of each.
    fn watchers(&self) -> (Vec<Source>, Vec<Probe>, BoxStream<'static, Tagged>) {
        let scopes: Vec<Option<String>> = if self.namespaces.is_empty() {
            vec![None]
        } else {
            self.namespaces.iter().cloned().map(Some).collect()
        };
        let mut sources = Vec::new();
        let mut probes = Vec::new();
        let mut streams = Vec::new();
        let mut add = |kind, resource, scope: Option<String>, p, s| {
            probes.push(p);
            sources.push(Source {
                kind,
                activity: Activity {
                    resource,
                    namespace: scope.clone(),
                },
                scope,
                buffer: None,
                listed: false,
            });
            streams.push(s);
        };
        let config = watcher::Config::default().timeout(self.watch_timeout);
        for scope in scopes {
            let mut svc_cfg = config.clone();
            if let Some(sel) = &self.label_selector {
                svc_cfg = svc_cfg.labels(sel);
            }
            let api: Api<KubeService> = self.api(&scope);
            let s = items(object_watcher(api.clone(), svc_cfg), service_item);
            add(Kind::Services, "services", scope.clone(), probe(api), s);
            let api: Api<EndpointSlice> = self.api(&scope);
            let s = items(object_watcher(api.clone(), config.clone()), slice_item);
            add(
                Kind::Slices,
                "endpointslices.discovery.k8s.io",
                scope.clone(),
                probe(api),
                s,
            );
            if self.read_pods {
                let api: Api<Pod> = self.api(&scope);
                let s = items(object_watcher(api.clone(), config.clone()), pod_item);
                add(Kind::Pods, "pods", scope.clone(), probe(api), s);
            }
        }
        if self.read_nodes {
            // Metadata only: the labels are all that is read of a node.
            let api: Api<PartialObjectMeta<Node>> = Api::all(self.client.clone());
            let s = items(object_watcher(api, config.clone()), node_item);
            let nodes: Api<Node> = Api::all(self.client.clone());
            add(Kind::Nodes, "nodes", None, probe(nodes), s);
        }
        let tagged = streams
            .into_iter()
            .enumerate()
            .map(|(i, s)| s.map(move |r| (i, r)).boxed());
        (sources, probes, stream::select_all(tagged).boxed())
    }

    async fn run(&self, tx: EventSender) -> Result<(), RegistryError> {
        let (mut sources, probes, mut events) = self.watchers();
        let mut outage = Outage::new(probes);
        // Whether the core was told `Retrying` and not yet `Recovered` or a `Reset`.
        let mut reported = false;
        let mut last_error: Option<RegistryError> = None;
        let mut cluster = Cluster::default();
        let mut sent: BTreeSet<ObjKey> = BTreeSet::new();
        let mut synced = false;
        loop {
            let (i, result) = tokio::select! {
                next = events.next() => match next {
                    Some(tagged) => tagged,
                    None => return Err(RegistryError::Ended),
                },
                answered = outage.next_round(), if outage.is_on() => {
                    for i in answered {
                        if outage.answered(i) {
                            tracing::info!(what = %sources[i].activity, "the API server answers again; the watch resumes where it was");
                        }
                    }
                    if !outage.is_on() && reported && synced {
                        reported = false;
                        tx.send(RegistryEvent::Recovered).await?;
                    }
                    continue;
                }
            };
            let source = &mut sources[i];
            let event = match result {
                Ok(e) => {
                    if outage.answered(i) && reported && synced {
                        reported = false;
                        tx.send(RegistryEvent::Recovered).await?;
                    }
                    e
                }
                Err(err) => match classify(&err, &source.activity) {
                    Failure::Expired => {
                        tracing::info!(what = %source.activity, "resource version expired; listing again");
                        continue;
                    }
                    Failure::Transient(e) => {
                        tracing::warn!(what = %source.activity, error = %e, "watch failed; retrying from the last resource version");
                        outage.failed(i);
                        last_error = Some(e.clone());
                        if !reported {
                            reported = true;
                            tx.send(RegistryEvent::Retrying(e)).await?;
                        }
                        continue;
                    }
                    Failure::Fatal(e) => return Err(e),
                },
            };
            match event {
                Event::Init => source.buffer = Some(Vec::new()),
                Event::InitApply(item) => source.buffer.get_or_insert_with(Vec::new).push(item),
                Event::InitDone => {
                    let items = source.buffer.take().unwrap_or_default();
                    tracing::debug!(what = %source.activity, objects = items.len(), "listed");
                    cluster.replace(source.kind, source.scope.as_deref(), items);
                    source.listed = true;
                    if sources.iter().all(|s| s.listed) {
                        sent = self.reset(&cluster, &tx).await?;
                        synced = true;
                        // A `Reset` makes the core healthy: say again if a watcher still fails.
                        reported = false;
                        if let Some(e) = last_error.clone().filter(|_| outage.is_on()) {
                            reported = true;
                            tx.send(RegistryEvent::Retrying(e)).await?;
                        }
                    }
                }
                Event::Apply(item) => {
                    let touched = cluster.apply(item);
                    if synced {
                        self.update(&cluster, touched, &mut sent, &tx).await?;
                    }
                }
                Event::Delete(item) => {
                    let touched = cluster.delete(item);
                    if synced {
                        self.update(&cluster, touched, &mut sent, &tx).await?;
                    }
                }
            }
        }
    }

    /// Sends everything as one `Reset`; the keys sent.
    async fn reset(
        &self,
        cluster: &Cluster,
        tx: &EventSender,
    ) -> Result<BTreeSet<ObjKey>, RegistryError> {
        let mut services: Vec<Service> = Vec::new();
        let mut sent = BTreeSet::new();
        let mut problems: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for key in cluster.service_keys() {
            let out = convert_service(cluster, &key, &self.settings);
            if !out.problems.is_empty() {
                problems.insert(scope(&key), out.problems);
            }
            if let Some(s) = out.service {
                services.push(s);
                sent.insert(key);
            }
        }
        // The ledger outlives watches, as the core's problems do: a new watch's Reset clears the
        // scopes that no longer have problems.
        let problem_events = self
            .ledger
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace_all(problems);
        tracing::info!(services = services.len(), "cluster listed");
        tx.send(RegistryEvent::Reset(services)).await?;
        for e in problem_events {
            tx.send(e).await?;
        }
        Ok(sent)
    }

    /// Converts and sends the Services one change touched.
    async fn update(
        &self,
        cluster: &Cluster,
        touched: Vec<ObjKey>,
        sent: &mut BTreeSet<ObjKey>,
        tx: &EventSender,
    ) -> Result<(), RegistryError> {
        for key in touched {
            let out = convert_service(cluster, &key, &self.settings);
            let problem = self
                .ledger
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .update(&scope(&key), out.problems);
            match out.service {
                Some(s) => {
                    sent.insert(key);
                    tx.send(RegistryEvent::Upsert(s)).await?;
                }
                None => {
                    if sent.remove(&key) {
                        let (ns, name) = key;
                        tx.send(RegistryEvent::Remove(mcp_core::ServiceKey::namespaced(
                            ns, name,
                        )))
                        .await?;
                    }
                }
            }
            if let Some(e) = problem {
                tx.send(e).await?;
            }
        }
        Ok(())
    }
}

/// The problem scope of a Service.
fn scope((ns, name): &ObjKey) -> String {
    format!("service {ns}/{name}")
}
