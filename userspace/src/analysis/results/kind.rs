//! A series' kind in the result file: a passive view's (the registry's kinds, by name) or an
//! active tool's. Written as its name, a lowercase string; its serde and JSON Schema impls are
//! written by hand so a passive view's kind, name and description come from its registry entry
//! (`analysis/view_kind.rs`) and a new view needs no line here.
use std::borrow::Cow;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::analysis::view_kind::ViewKind as PassiveKind;

/// Which way of measuring RTT a series comes from.
///
/// Written as [`ViewKind::as_str`]; a name this build does not know (a newer file's) reads as
/// [`ViewKind::Other`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ViewKind {
    /// A passive view's samples, named as the view is ([`PassiveKind::as_str`]; what they are:
    /// `ViewInfo::series_about`).
    Passive(PassiveKind),
    /// Active request/response probes (netperf TCP_RR / UDP_RR-like).
    Probe,
    /// ICMP echo.
    Ping,
    /// irtt.
    Irtt,
    /// Anything else; unknown kinds from newer files read as this.
    Other,
}

/// The schema's description of the kind itself.
const ABOUT: &str = "Which way of measuring RTT a series comes from.";

impl ViewKind {
    /// The kinds that are not a passive view's, in the order the schema lists them.
    const ACTIVE: [ViewKind; 4] = [
        ViewKind::Probe,
        ViewKind::Ping,
        ViewKind::Irtt,
        ViewKind::Other,
    ];

    /// Every kind: each passive view's in registry order ([`PassiveKind::ALL`]), then the
    /// active tools' and `other` (the schema's order).
    pub fn all() -> impl Iterator<Item = ViewKind> {
        PassiveKind::ALL
            .iter()
            .map(|&k| ViewKind::Passive(k))
            .chain(Self::ACTIVE)
    }

    /// The kind of a name as files write it (Other: none of these).
    pub fn from_name(name: &str) -> ViewKind {
        match PassiveKind::from_name(name) {
            Some(k) => ViewKind::Passive(k),
            None => Self::ACTIVE
                .into_iter()
                .find(|k| k.as_str() == name)
                .unwrap_or(ViewKind::Other),
        }
    }

    /// Its name as files write it.
    pub fn as_str(self) -> &'static str {
        match self {
            ViewKind::Passive(k) => k.as_str(),
            ViewKind::Probe => "probe",
            ViewKind::Ping => "ping",
            ViewKind::Irtt => "irtt",
            ViewKind::Other => "other",
        }
    }

    /// What its series are: the result schema's description of it.
    pub fn about(self) -> &'static str {
        match self {
            ViewKind::Passive(k) => k.info().series_about,
            ViewKind::Probe => "Active request/response probes (netperf TCP_RR / UDP_RR-like).",
            ViewKind::Ping => "ICMP echo.",
            ViewKind::Irtt => "irtt.",
            ViewKind::Other => "Anything else; unknown kinds from newer files read as this.",
        }
    }
}

impl Serialize for ViewKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ViewKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ViewKind, D::Error> {
        let name = Cow::<str>::deserialize(d)?;
        Ok(ViewKind::from_name(&name))
    }
}

/// As schemars derives an enum of unit variants with doc comments: one `const` string per kind,
/// described, under `oneOf`.
impl JsonSchema for ViewKind {
    fn schema_name() -> Cow<'static, str> {
        "ViewKind".into()
    }

    fn schema_id() -> Cow<'static, str> {
        concat!(module_path!(), "::ViewKind").into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let kinds: Vec<serde_json::Value> = ViewKind::all()
            .map(|k| {
                serde_json::json!({
                    "description": k.about(),
                    "type": "string",
                    "const": k.as_str(),
                })
            })
            .collect();
        json_schema!({
            "description": ABOUT,
            "oneOf": kinds,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind's name reads back as that kind; an unknown name reads as `other`; the JSON form
    /// is the name.
    #[test]
    fn names_round_trip() {
        let all: Vec<ViewKind> = ViewKind::all().collect();
        assert_eq!(all.len(), PassiveKind::ALL.len() + 4, "{all:?}");
        for k in &all {
            assert_eq!(ViewKind::from_name(k.as_str()), *k);
            let json = serde_json::to_string(k).unwrap();
            assert_eq!(json, format!("\"{}\"", k.as_str()));
            assert_eq!(serde_json::from_str::<ViewKind>(&json).unwrap(), *k);
        }
        // the names as files have always written them
        let names: Vec<&str> = all.iter().map(|k| k.as_str()).collect();
        for name in ["tcp", "sampler", "probe", "ping", "irtt", "other"] {
            assert!(names.contains(&name), "{name} not in {names:?}");
        }
        assert_eq!(
            ViewKind::from_name("tcp"),
            ViewKind::Passive(PassiveKind::Tcp)
        );
        assert_eq!(ViewKind::from_name("ping"), ViewKind::Ping);
        for unknown in ["quantum", "", "TCP", "tcp ", "others"] {
            assert_eq!(ViewKind::from_name(unknown), ViewKind::Other, "{unknown:?}");
            let json = serde_json::to_string(unknown).unwrap();
            assert_eq!(
                serde_json::from_str::<ViewKind>(&json).unwrap(),
                ViewKind::Other
            );
        }
        // a string with an escape (not borrowable from the input) reads too
        assert_eq!(
            serde_json::from_str::<ViewKind>(r#""pin\u0067""#).unwrap(),
            ViewKind::Ping
        );
        assert!(serde_json::from_str::<ViewKind>("3").is_err());
    }

    /// The schema lists every kind once, in order (the registry's, then the others), each as a
    /// described constant; a passive view's description is its registry entry's.
    #[test]
    fn schema_lists_every_kind() {
        let schema = serde_json::to_value(schemars::schema_for!(ViewKind)).unwrap();
        assert_eq!(schema["description"], ABOUT);
        let one_of = schema["oneOf"].as_array().unwrap();
        let consts: Vec<&str> = one_of
            .iter()
            .map(|v| v["const"].as_str().unwrap())
            .collect();
        let want: Vec<&str> = PassiveKind::ALL
            .iter()
            .map(|k| k.as_str())
            .chain(["probe", "ping", "irtt", "other"])
            .collect();
        assert_eq!(consts, want);
        for (v, k) in one_of.iter().zip(PassiveKind::ALL) {
            assert_eq!(v["description"], k.info().series_about, "{v}");
            assert_eq!(v["type"], "string", "{v}");
        }
        assert!(one_of
            .iter()
            .all(|v| v["description"].as_str().is_some_and(|d| !d.is_empty())));
    }
}
