//! What a user pins: explicit layer ranges (`--layers NODE:0-9,…`) and the nodes a launch runs on
//! (`--nodes A,B`), each name checked against the nodes that are up.

use super::{link_table, mb, LinkCost, ModelNeeds, NodeOffer, PlacementError, Plan, Ring};
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// One node's part of an explicit override: a node (name, id or id prefix) and its layers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerAssignment {
    pub node: String,
    pub layers: Range<usize>,
}

/// Parses `NODE:0-9,NODE:10-29` (inclusive ranges, in ring order).
pub fn parse_layers(spec: &str) -> Result<Vec<LayerAssignment>, PlacementError> {
    spec.split(',')
        .map(|part| {
            let bad = || PlacementError::BadOverride(format!("{part:?} is not NODE:FIRST-LAST"));
            let (node, range) = part.trim().rsplit_once(':').ok_or_else(bad)?;
            let (a, b) = range.split_once('-').ok_or_else(bad)?;
            let (a, b): (usize, usize) = (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?);
            if node.is_empty() || b < a {
                return Err(bad());
            }
            Ok(LayerAssignment { node: node.to_string(), layers: a..b.checked_add(1).ok_or_else(bad)? })
        })
        .collect()
}

/// The nodes `names` (names or id prefixes, as in an override) name, in that order: each must name
/// exactly one node that is up, and none twice.
pub fn pinned(nodes: &[NodeOffer], names: &[String]) -> Result<Vec<NodeOffer>, PlacementError> {
    let mut chosen: Vec<NodeOffer> = Vec::new();
    for name in names {
        let node = match nodes_named(nodes, name).as_slice() {
            [one] => (*one).clone(),
            [] => return Err(PlacementError::BadOverride(format!("no node up is called {name}"))),
            _ => return Err(PlacementError::BadOverride(format!("{name} names more than one node"))),
        };
        if chosen.iter().any(|c| c.id == node.id) {
            return Err(PlacementError::BadOverride(format!("{name} is named twice")));
        }
        chosen.push(node);
    }
    if chosen.is_empty() {
        return Err(PlacementError::BadOverride("name at least one node".into()));
    }
    Ok(chosen)
}

/// The nodes a name in an override means: an exact name or id wins; otherwise an id prefix of at least
/// four characters (a shorter one would match random ids by chance: "b" names every id starting with b).
fn nodes_named<'a>(nodes: &'a [NodeOffer], name: &str) -> Vec<&'a NodeOffer> {
    let exact: Vec<&NodeOffer> = nodes.iter().filter(|n| n.name == name || n.id.to_string() == name).collect();
    if !exact.is_empty() || name.len() < 4 {
        return exact;
    }
    nodes.iter().filter(|n| n.id.to_string().starts_with(name)).collect()
}

/// The plan an explicit `--layers` override describes, if it fits.
pub fn plan_override(
    needs: &ModelNeeds,
    nodes: &[NodeOffer],
    links: &[LinkCost],
    assignment: &[LayerAssignment],
) -> Result<Plan, PlacementError> {
    let mut expected = 0;
    let mut chosen = Vec::new();
    for a in assignment {
        if a.layers.start != expected {
            return Err(PlacementError::BadOverride(format!(
                "ranges must cover layers 0-{} in order; {} starts at {} where {expected} was expected",
                needs.layers() - 1,
                a.node,
                a.layers.start
            )));
        }
        if !needs.may_begin_stage(a.layers.start) {
            return Err(PlacementError::BadOverride(format!(
                "{} cannot begin at layer {}: that layer has no lightning indexer of its own and attends to the \
                 positions an earlier layer's indexer chose; begin each range at a layer with one",
                a.node, a.layers.start
            )));
        }
        expected = a.layers.end;
        match nodes_named(nodes, &a.node).as_slice() {
            [one] => chosen.push(*one),
            [] => return Err(PlacementError::BadOverride(format!("no node up is called {}", a.node))),
            _ => return Err(PlacementError::BadOverride(format!("{} names more than one node", a.node))),
        }
    }
    if expected != needs.layers() {
        return Err(PlacementError::BadOverride(format!(
            "ranges end at layer {} but the model has {} layers",
            expected.saturating_sub(1),
            needs.layers()
        )));
    }
    let table = link_table(links);
    let ring = Ring { needs, nodes: chosen, links: &table };
    let plan = ring.plan(assignment.iter().map(|a| a.layers.clone()).collect());
    let short: Vec<String> = plan
        .stages
        .iter()
        .filter(|s| s.bytes.total() > s.offer)
        .map(|s| {
            format!(
                "{} needs {} for layers {}-{} but offers {}",
                s.node_name,
                mb(s.bytes.total()),
                s.layers.start,
                s.layers.end - 1,
                mb(s.offer)
            )
        })
        .collect();
    if !short.is_empty() {
        return Err(PlacementError::DoesNotFit(format!("the requested split does not fit: {}", short.join("; "))));
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_overrides_parse() {
        let a = parse_layers("studio-1:0-9, 1a2b:10-29").unwrap();
        assert_eq!(a[0], LayerAssignment { node: "studio-1".into(), layers: 0..10 });
        assert_eq!(a[1].layers, 10..30);
        assert!(parse_layers("x:9-0").is_err());
        assert!(parse_layers("x:0-").is_err());
        assert!(parse_layers(":0-3").is_err());
    }
}
