//! Which namespaces and services a server has: how a watch lists them, and reading one
//! namespace's list so that a service is never dropped on one listing's word.
//!
//! How ([`Listing`], found once per watch by [`detect`]):
//! - Nacos 2.x: its console API lists a namespace's services of every group
//!   (`/nacos/v1/ns/catalog/services`) and the namespaces (`/nacos/v1/console/namespaces`).
//! - Nacos 3.x answers those `410 Gone` by default; its admin API lists the same
//!   (`/nacos/v3/admin/ns/service/list`, `/nacos/v3/admin/core/namespace/list`) for a user
//!   allowed to read them (the admin API wants a login even with auth off).
//! - Neither (3.x without such a user, a 2.x user without console rights): the gRPC
//!   `ServiceListRequest` Nacos serves to every client, one group per request. No client API
//!   lists groups or namespaces, so then the groups are the exact names given with `--group`
//!   (else `DEFAULT_GROUP`) and the namespaces those of `--nacos-namespace` (else `public`); the
//!   watch says so in its log.
//!
//! Every list is paged by offset over a set that changes while it is read: a service added or
//! removed between two page reads shifts others across a page boundary, so one read can miss a
//! service that never left. [`list_namespace`] therefore reads again whenever a read looks torn
//! (the pages disagree on the total, or their names do not add up to it) or lacks a service the
//! watch has: a service is removed only when two reads in a row lack it. The page loop trusts no
//! count: it stops at a short page, at a page that brings nothing new, and after the pages the
//! first count allows.

use std::collections::BTreeSet;
use std::future::Future;

use crate::http::{HttpClientError, ListingApi, Page};

/// Names read per page. The server's cost of a page is a walk over the whole namespace, so
/// larger pages cost it less; a thousand names are about 100 KiB of JSON.
pub const PAGE_SIZE: u64 = 1000;

/// `(group, name)` of a service within a namespace.
pub type Name = (String, String);

/// How a watch lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listing {
    /// Over HTTP, every group at once.
    Http(ListingApi),
    /// Over each namespace's gRPC connection, one group per request: these groups.
    Grpc {
        /// The groups listed.
        groups: Vec<String>,
    },
}

impl Listing {
    /// What the log and `/registryz` call it.
    pub fn describe(&self) -> String {
        match self {
            Self::Http(api) => format!("GET {}", api.services_path()),
            Self::Grpc { groups } => format!("gRPC ServiceListRequest for groups {groups:?}"),
        }
    }
}

/// Which listing `namespace` (one the watch reads) answers to: the console API, else the admin
/// API, else gRPC for `groups`. `Err` only when the server cannot be reached at all.
pub async fn detect<F, Fut>(mut probe: F, groups: Vec<String>) -> Result<Listing, HttpClientError>
where
    F: FnMut(ListingApi) -> Fut,
    Fut: Future<Output = Result<Page, HttpClientError>>,
{
    for api in [ListingApi::Console, ListingApi::Admin] {
        match probe(api).await {
            Ok(_) => return Ok(Listing::Http(api)),
            Err(e @ (HttpClientError::NotServed { .. } | HttpClientError::Unauthorized { .. })) => {
                tracing::info!(api = api.services_path(), error = %e, "Nacos does not list services this way here; trying the next.");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Listing::Grpc { groups })
}

/// The groups a gRPC listing reads for `--group` patterns `allow`: the exact names among them
/// (a glob cannot be expanded without a listing of groups, which Nacos does not offer clients),
/// or `DEFAULT_GROUP` when none is given. The second value lists the globs left out.
pub fn grpc_groups(allow: &[String]) -> (Vec<String>, Vec<String>) {
    let (globs, exact): (Vec<String>, Vec<String>) = allow
        .iter()
        .map(|g| g.trim().to_string())
        .filter(|g| !g.is_empty())
        .partition(|g| g.contains(['*', '?']));
    let mut groups = if exact.is_empty() {
        vec![crate::dto::DEFAULT_GROUP.to_string()]
    } else {
        exact
    };
    groups.sort();
    groups.dedup();
    (groups, globs)
}

/// One read of every page.
#[derive(Debug, Default)]
struct Read {
    names: BTreeSet<Name>,
    /// The pages agreed on the total, and the names add up to it.
    whole: bool,
}

/// Reads every page `fetch(page_no)` gives (from 1, of [`PAGE_SIZE`]).
async fn read_pages<F, Fut, E>(fetch: &mut F) -> Result<Read, E>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Result<Page, E>>,
{
    let mut names = BTreeSet::new();
    let mut counts = BTreeSet::new();
    let mut last_page = None;
    let mut page_no = 1;
    loop {
        let page = fetch(page_no).await?;
        counts.insert(page.count);
        let got = page.names.len() as u64;
        let before = names.len();
        names.extend(page.names);
        // The pages the first count allows, and one more for a service added meanwhile.
        let last = *last_page.get_or_insert(page.count / PAGE_SIZE + 2);
        let full = got >= PAGE_SIZE;
        if !full || names.len() as u64 >= page.count || page_no >= last || names.len() == before {
            break;
        }
        page_no += 1;
    }
    let whole = counts.len() == 1 && counts.first() == Some(&(names.len() as u64));
    Ok(Read { names, whole })
}

/// The services of one namespace: every page read, and read again when that read looks torn or
/// lacks one of `known` (what the watch has); a name in either read is kept, so a service
/// leaves only when two reads in a row lack it.
pub async fn list_namespace<F, Fut, E>(
    known: &BTreeSet<Name>,
    mut fetch: F,
) -> Result<BTreeSet<Name>, E>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Result<Page, E>>,
{
    let first = read_pages(&mut fetch).await?;
    let lacks = known.iter().any(|k| !first.names.contains(k));
    if first.whole && !lacks {
        return Ok(first.names);
    }
    let second = read_pages(&mut fetch).await?;
    let mut names = first.names;
    names.extend(second.names);
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    fn n(name: &str) -> Name {
        ("G".to_string(), name.to_string())
    }

    /// A server's set read by offset, in the order it iterates, with `between(page_no)` run
    /// before each page is cut: what changes while a listing is read.
    fn paged<'a>(
        set: &'a RefCell<Vec<String>>,
        page_size: usize,
        mut between: impl FnMut(u64, &mut Vec<String>) + 'a,
    ) -> impl FnMut(u64) -> std::future::Ready<Result<Page, ()>> + 'a {
        move |page_no| {
            between(page_no, &mut set.borrow_mut());
            let all = set.borrow();
            let start = (page_no as usize - 1) * page_size;
            let names = all
                .iter()
                .skip(start)
                .take(page_size)
                .map(|s| n(s))
                .collect();
            std::future::ready(Ok(Page {
                count: all.len() as u64,
                names,
            }))
        }
    }

    fn names(count: usize) -> Vec<String> {
        (0..count).map(|i| format!("svc-{i:05}")).collect()
    }

    #[tokio::test]
    async fn a_service_shifted_across_a_page_boundary_is_not_dropped() {
        // 1500 services over two pages. Between the two page reads one service near the start
        // leaves and a new one lands at the end: everything after it moves up by one, so
        // the first service of page 2 (index 1000) slips onto page 1, which was read already.
        let set = RefCell::new(names(1500));
        let known: BTreeSet<Name> = set.borrow().iter().map(|s| n(s)).collect();
        let shifted = n("svc-01000");
        let mut churned = false;
        let fetch = paged(&set, PAGE_SIZE as usize, |page, all| {
            if page == 2 && !churned {
                churned = true;
                all.remove(3);
                all.push("svc-new".into());
            }
        });
        let listed = list_namespace(&known, fetch).await.expect("listed");
        assert!(listed.contains(&shifted), "a present service was dropped");
        assert!(listed.contains(&n("svc-new")), "the new one is found");
        // The one that left is still listed (by the first read): it goes at the next listing.
        assert!(listed.contains(&n("svc-00003")));

        // The next listing, with nothing changing: it is gone, nothing else is.
        let known = listed;
        let fetch = paged(&set, PAGE_SIZE as usize, |_, _| {});
        let listed = list_namespace(&known, fetch).await.expect("listed");
        assert!(!listed.contains(&n("svc-00003")));
        assert_eq!(listed.len(), 1500);
    }

    #[tokio::test]
    async fn one_read_is_enough_while_nothing_is_missing_or_torn() {
        let set = RefCell::new(names(2500));
        let known: BTreeSet<Name> = set.borrow().iter().map(|s| n(s)).collect();
        let reads = RefCell::new(0u64);
        let fetch = paged(&set, PAGE_SIZE as usize, |_, _| *reads.borrow_mut() += 1);
        let listed = list_namespace(&known, fetch).await.expect("listed");
        assert_eq!(listed.len(), 2500);
        assert_eq!(*reads.borrow(), 3, "three pages, read once");
    }

    #[tokio::test]
    async fn a_server_that_keeps_sending_full_pages_is_not_read_forever() {
        // Every page the same full page, and a count no listing reaches: a loop that trusts the
        // count reads forever.
        let pages = RefCell::new(0u64);
        let fetch = |_page: u64| {
            *pages.borrow_mut() += 1;
            std::future::ready(Ok::<_, ()>(Page {
                count: u64::MAX / 2,
                names: (0..PAGE_SIZE).map(|i| n(&format!("s{i}"))).collect(),
            }))
        };
        let listed = list_namespace(&BTreeSet::new(), fetch)
            .await
            .expect("listed");
        assert_eq!(listed.len(), PAGE_SIZE as usize);
        // Page 2 brought nothing new: each read stops there (and the torn read is read again).
        assert_eq!(*pages.borrow(), 4);

        // Nacos 2.x answers every page with the whole list when it is shorter than a page.
        let set = RefCell::new(names(10));
        let fetch = |_page: u64| {
            std::future::ready(Ok::<_, ()>(Page {
                count: 10,
                names: set.borrow().iter().map(|s| n(s)).collect(),
            }))
        };
        assert_eq!(
            list_namespace(&BTreeSet::new(), fetch)
                .await
                .expect("listed")
                .len(),
            10
        );
    }

    #[test]
    fn grpc_groups_are_the_exact_names_given() {
        let (g, globs) = grpc_groups(&[]);
        assert_eq!((g, globs), (vec!["DEFAULT_GROUP".to_string()], vec![]));
        let given = ["SHOP".to_string(), "DEFAULT_GROUP".into(), "pay-*".into()];
        let (g, globs) = grpc_groups(&given);
        assert_eq!(g, ["DEFAULT_GROUP", "SHOP"]);
        assert_eq!(globs, ["pay-*"]);
    }

    #[tokio::test]
    async fn detect_falls_back_from_console_to_admin_to_grpc() {
        let gone = || HttpClientError::NotServed {
            server: "s".into(),
            what: "w".into(),
            status: 410,
            message: String::new(),
        };
        let refused = || HttpClientError::Unauthorized {
            server: "s".into(),
            what: "w".into(),
            status: 403,
            message: String::new(),
        };
        let groups = vec!["DEFAULT_GROUP".to_string()];
        let l = detect(|_| std::future::ready(Ok(Page::default())), groups.clone()).await;
        assert_eq!(l.expect("2.x"), Listing::Http(ListingApi::Console));
        let l = detect(
            |api| {
                std::future::ready(match api {
                    ListingApi::Console => Err(gone()),
                    ListingApi::Admin => Ok(Page::default()),
                })
            },
            groups.clone(),
        )
        .await;
        assert_eq!(l.expect("3.x admin"), Listing::Http(ListingApi::Admin));
        let l = detect(
            |api| {
                std::future::ready(match api {
                    ListingApi::Console => Err(gone()),
                    ListingApi::Admin => Err(refused()),
                })
            },
            groups.clone(),
        )
        .await;
        assert_eq!(l.expect("3.x, no admin"), Listing::Grpc { groups });
        let down = detect(
            |_| {
                std::future::ready(Err(HttpClientError::Unavailable {
                    server: "s".into(),
                    message: "refused".into(),
                }))
            },
            vec![],
        )
        .await;
        assert!(down.is_err());
    }
}
