//! Basic authentication against `basic_auth_users` (bcrypt hashes), with exporter-toolkit's
//! cache of successful checks: bcrypt is slow by design (~50 ms at cost 10), and Prometheus
//! sends the same credentials every scrape. The cache holds SHA-256 digests of (user, hash,
//! password), never a password, and at most [`CACHE_ENTRIES`] of them.
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use super::file::PasswordHash;

/// Successful checks remembered (oldest forgotten first), as exporter-toolkit's 100.
pub const CACHE_ENTRIES: usize = 100;

/// A bcrypt hash (cost 10) checked when the user is unknown, so an unknown user takes as
/// long to refuse as a wrong password (exporter-toolkit's; of no password anyone uses).
const UNKNOWN_USER_HASH: &str = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi";

/// The users of the web config: name -> bcrypt hash, each hash checked to be one.
#[derive(Debug, Default)]
pub struct Users(BTreeMap<String, PasswordHash>);

impl Users {
    /// From `basic_auth_users`: one sentence for a value that is not a bcrypt hash (the
    /// value is not quoted).
    pub fn new(users: BTreeMap<String, PasswordHash>) -> Result<Users, String> {
        for (name, hash) in &users {
            if bcrypt::HashParts::from_str(&hash.0).is_err() {
                return Err(format!(
                    "basic_auth_users: the password of '{}' is not a bcrypt hash ($2y$..., e.g. from `htpasswd -nBC 10 USER`)",
                    crate::analysis::input::quote_input(name)
                ));
            }
        }
        Ok(Users(users))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The bounded set of (user, hash, password) digests that passed bcrypt.
#[derive(Debug, Default)]
pub struct Cache(Mutex<Digests>);

/// The digests held, and their order of arrival (the oldest is forgotten first).
type Digests = (HashSet<[u8; 32]>, VecDeque<[u8; 32]>);

impl Cache {
    fn contains(&self, key: &[u8; 32]) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .contains(key)
    }

    fn insert(&self, key: [u8; 32]) {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (set, order) = &mut *g;
        if !set.insert(key) {
            return;
        }
        order.push_back(key);
        while order.len() > CACHE_ENTRIES {
            if let Some(old) = order.pop_front() {
                set.remove(&old);
            }
        }
    }

    /// Entries held (at most [`CACHE_ENTRIES`]).
    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The cache's key: SHA-256 of the three, each preceded by its length.
fn cache_key(user: &str, hash: &str, password: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    for part in [user.as_bytes(), hash.as_bytes(), password] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.finalize().into()
}

/// User and password of an `Authorization: Basic ...` header value.
pub fn basic_credentials(header: &[u8]) -> Option<(String, Vec<u8>)> {
    use base64::Engine;
    let s = std::str::from_utf8(header).ok()?.trim();
    let (scheme, b64) = s.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .ok()?;
    let at = raw.iter().position(|b| *b == b':')?;
    let user = String::from_utf8(raw[..at].to_vec()).ok()?;
    Some((user, raw[at + 1..].to_vec()))
}

/// Whether the `Authorization` header value lets its user in: a cached success, else
/// bcrypt, run with `verify` (the server runs it on tokio's blocking pool). An unknown user
/// is checked against a dummy hash (the same time spent) and refused.
pub async fn allowed<F, Fut>(
    users: &Users,
    cache: &Arc<Cache>,
    header: Option<&[u8]>,
    verify: F,
) -> bool
where
    F: FnOnce(Vec<u8>, String) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let Some((user, password)) = header.and_then(basic_credentials) else {
        return false;
    };
    let known = users.0.get(&user).map(|h| h.0.clone());
    let hash = known
        .clone()
        .unwrap_or_else(|| UNKNOWN_USER_HASH.to_string());
    let key = cache_key(&user, &hash, &password);
    if known.is_some() && cache.contains(&key) {
        return true;
    }
    let ok = verify(password, hash).await && known.is_some();
    if ok {
        cache.insert(key);
    }
    ok
}

/// bcrypt's check of `password` against `hash` (false on any error).
pub fn bcrypt_matches(password: &[u8], hash: &str) -> bool {
    bcrypt::verify(password, hash).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;

    fn header(user: &str, pw: &str) -> Vec<u8> {
        let b = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pw}"));
        format!("Basic {b}").into_bytes()
    }

    fn users(pairs: &[(&str, &str)]) -> Users {
        let m = pairs
            .iter()
            .map(|(u, h)| (u.to_string(), PasswordHash(h.to_string())))
            .collect();
        Users::new(m).unwrap()
    }

    /// bcrypt on this thread, counting the calls.
    async fn check(u: &Users, c: &Arc<Cache>, h: Option<&[u8]>, calls: &mut u32) -> bool {
        allowed(u, c, h, |p, hash| {
            *calls += 1;
            async move { bcrypt_matches(&p, &hash) }
        })
        .await
    }

    #[tokio::test]
    async fn the_right_password_passes_and_is_cached_others_do_not() {
        let hash = bcrypt::hash("s3cret:with colon", 4).unwrap();
        let u = users(&[("prom", &hash)]);
        let c = Arc::new(Cache::default());
        let mut calls = 0;
        let good = header("prom", "s3cret:with colon");
        assert!(check(&u, &c, Some(&good), &mut calls).await);
        assert!(check(&u, &c, Some(&good), &mut calls).await);
        assert_eq!(calls, 1, "the second check came from the cache");
        assert_eq!(c.len(), 1);
        for bad in [
            header("prom", "wrong"),
            header("prom", ""),
            header("nobody", "s3cret:with colon"),
            b"Basic !!!".to_vec(),
            b"Bearer x".to_vec(),
            b"Basic cHJvbQ==".to_vec(), // "prom", no colon
        ] {
            assert!(
                !check(&u, &c, Some(&bad), &mut calls).await,
                "{}",
                String::from_utf8_lossy(&bad)
            );
        }
        assert!(!check(&u, &c, None, &mut calls).await);
        assert_eq!(c.len(), 1, "failures are not cached");
        // The user's hash changed (a reload): the cached success no longer applies.
        let u2 = users(&[("prom", &bcrypt::hash("new", 4).unwrap())]);
        let before = calls;
        assert!(!check(&u2, &c, Some(&good), &mut calls).await);
        assert_eq!(calls, before + 1);
    }

    #[test]
    fn the_cache_keeps_at_most_its_bound_oldest_forgotten_first() {
        let c = Cache::default();
        for i in 0..(CACHE_ENTRIES as u32 * 3) {
            c.insert(cache_key("u", "h", &i.to_le_bytes()));
        }
        assert_eq!(c.len(), CACHE_ENTRIES);
        let last = CACHE_ENTRIES as u32 * 3 - 1;
        assert!(c.contains(&cache_key("u", "h", &last.to_le_bytes())));
        assert!(!c.contains(&cache_key("u", "h", &0u32.to_le_bytes())));
        // Distinct splits of the same bytes are distinct keys.
        assert_ne!(cache_key("ab", "c", b""), cache_key("a", "bc", b""));
    }

    #[test]
    fn a_value_that_is_not_a_bcrypt_hash_is_refused_without_quoting_it() {
        let m = [("alice".to_string(), PasswordHash("plaintext-pw".into()))]
            .into_iter()
            .collect();
        let e = Users::new(m).unwrap_err();
        assert!(e.contains("'alice' is not a bcrypt hash"), "{e}");
        assert!(!e.contains("plaintext-pw"), "{e}");
        assert_eq!(
            format!("{:?}", PasswordHash("x".into())),
            "<hash>",
            "Debug never shows a hash"
        );
    }
}
