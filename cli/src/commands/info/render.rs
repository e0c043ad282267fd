//! `liqoctl info` as tables. The overview fits the terminal (or 100
//! columns where there is none): its columns are those an administrator
//! reads first, and a cell too long for its column wraps inside it. `-o
//! wide` adds the rest (cluster IDs, cost, tenant namespaces, certificate
//! expiry, mappings, selectors, remote namespaces) and is as wide as its
//! contents, as kubectl's is.

use comfy_table::{ColumnConstraint, ContentArrangement, Table, Width, presets::UTF8_BORDERS_ONLY};
use liqo_api::admission::Admission;

use super::{Info, NetworkView, PeeringView};
use crate::show::{show_cost, show_resources};

/// The width of the overview where no terminal tells one (a pipe, a CI
/// log): what a terminal of kubectl's users has at least.
pub(super) const DEFAULT_WIDTH: u16 = 100;

/// The narrowest a peering's status may be: `ProviderUnreachable`, the
/// longest reason of a virtual node, whole, with the cell's padding.
const STATUS_WIDTH: u16 = 21;

/// Below this width the peerings are one small table each.
const NARROW: u16 = 80;

/// How the tables are laid out.
#[derive(Debug, Clone, Copy)]
pub(super) struct Layout {
    /// The columns of `-o wide` too.
    pub(super) wide: bool,
    /// Wrap cells so that no line is wider; `None`: as wide as the contents.
    pub(super) width: Option<u16>,
}

impl Layout {
    /// The overview at the terminal's width (`COLUMNS` where it is set,
    /// else [`DEFAULT_WIDTH`]), or `-o wide`, unbounded.
    pub(super) fn for_output(wide: bool) -> Self {
        let width = (!wide).then(|| {
            let columns = std::env::var("COLUMNS").ok().and_then(|c| c.parse().ok());
            columns
                .or_else(|| Table::new().width())
                .unwrap_or(DEFAULT_WIDTH)
        });
        Self { wide, width }
    }

    /// Narrower than the five columns of the peerings need.
    fn narrow(&self) -> bool {
        self.width.is_some_and(|w| w < NARROW)
    }

    /// A line of text wrapped to the width, its continuations indented
    /// one step more than it.
    fn wrap(&self, line: &str) -> Vec<String> {
        let Some(width) = self.width else {
            return vec![line.to_owned()];
        };
        let indent = " ".repeat(line.len() - line.trim_start().len() + 2);
        let options = textwrap::Options::new(usize::from(width)).subsequent_indent(&indent);
        textwrap::wrap(line, options)
            .into_iter()
            .map(|l| l.into_owned())
            .collect()
    }

    fn table<S: ToString>(&self, header: &[S]) -> Table {
        let mut t = Table::new();
        t.load_style(UTF8_BORDERS_ONLY)
            .set_header(header.iter().map(ToString::to_string).collect::<Vec<_>>());
        match self.width {
            Some(width) => {
                t.set_content_arrangement(ContentArrangement::Dynamic)
                    .set_width(width);
            }
            None => {
                t.set_content_arrangement(ContentArrangement::Disabled);
            }
        }
        t
    }
}

pub(super) fn render(info: &Info, layout: Layout) -> String {
    let table = |header: &[&str]| layout.table(header);
    let id = &info.identity;
    let mut identity = table(&["Local cluster", ""]);
    identity.add_row(vec!["Cluster ID", id.cluster_id.as_str()]);
    identity.add_row(vec!["Name", &id.cluster_name]);
    let labels: Vec<String> = id.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    identity.add_row(vec!["Labels".to_owned(), labels.join("\n")]);
    identity.add_row(vec!["Pod CIDR".to_owned(), id.pod_cidr.to_string()]);
    identity.add_row(vec!["Service CIDR".to_owned(), id.service_cidr.to_string()]);
    identity.add_row(vec!["Version", &id.version]);
    identity.add_row(vec!["Mode", &info.mode]);

    let mut agents = table(&["Agent", "Ready", "Image"]);
    for a in &info.agents {
        let state = format!(
            "{}/{}{}",
            a.ready_replicas,
            a.replicas,
            if a.ready { "" } else { " (not ready)" }
        );
        agents.add_row(vec![a.name.clone(), state, a.image.clone()]);
    }

    let mut out = format!("{identity}\n\n{agents}\n\n");
    if info.peerings.is_empty() {
        out.push_str("No peerings.\n");
    } else if layout.narrow() {
        // Too narrow for five columns: one small table per peering.
        for p in &info.peerings {
            let mut t = table(&[p.name.as_str(), ""]);
            t.add_row(vec!["Direction".to_owned(), p.direction.clone()]);
            t.add_row(vec!["Status".to_owned(), status_detail(p)]);
            let network = p.network.as_ref().map_or("-".to_owned(), NetworkView::line);
            t.add_row(vec!["Network".to_owned(), network]);
            t.add_row(vec!["Grant".to_owned(), grant_cell(p)]);
            out.push_str(&format!("{t}\n"));
        }
    } else {
        let mut header = vec!["Peer", "Direction", "Status", "Network", "Grant"];
        if layout.wide {
            header.extend([
                "Cluster ID",
                "Cost",
                "Tenant namespace",
                "Certificate expiry",
            ]);
        }
        let mut peerings = table(&header);
        // The status's first line names the reason in one word, as the
        // conditions do: kept whole (`Not ready: ProviderUnreachable`).
        if let Some(status) = peerings.column_mut(2) {
            status.set_constraint(ColumnConstraint::LowerBoundary(Width::Fixed(STATUS_WIDTH)));
        }
        for p in &info.peerings {
            let mut row = vec![
                p.name.clone(),
                p.direction.clone(),
                status_detail(p),
                p.network.as_ref().map_or("-".to_owned(), NetworkView::line),
                grant_cell(p),
            ];
            if layout.wide {
                row.extend([
                    p.cluster_id.clone(),
                    p.cost
                        .as_ref()
                        .map_or("-".to_owned(), |c| show_cost(c).replace(", ", "\n")),
                    p.tenant_namespace.clone().unwrap_or_else(|| "-".into()),
                    p.certificate_expiry.clone().unwrap_or_else(|| "-".into()),
                ]);
            }
            peerings.add_row(row);
        }
        out.push_str(&format!("{peerings}\n"));
    }
    if info.offloaded_namespaces.is_empty() {
        out.push_str("No offloaded namespaces.");
    } else {
        let header: &[&str] = if layout.wide {
            &[
                "Offloaded namespace",
                "Pods",
                "Mapping",
                "Selector",
                "Peer",
                "Remote namespace",
                "Status",
            ]
        } else {
            &["Offloaded namespace", "Pods", "Peer", "Status"]
        };
        let mut offloaded = table(header);
        for o in &info.offloaded_namespaces {
            let terms = o
                .cluster_selector
                .iter()
                .flat_map(|s| &s.node_selector_terms)
                .map(liqo_api::offloading::term_to_string)
                .collect::<Vec<_>>();
            let selector = if terms.is_empty() {
                "(all peers)".to_owned()
            } else {
                terms.join("\n")
            };
            let mut head = vec![
                o.namespace.clone(),
                match &o.pod_security {
                    Some(level) => format!("{}\n{level}", o.pod_offloading_strategy),
                    None => o.pod_offloading_strategy.clone(),
                },
            ];
            if layout.wide {
                head.extend([o.namespace_mapping_strategy.clone(), selector]);
            }
            // The peer's columns: its ID, with -o wide its twin namespace.
            let peer = |id: String, remote: String| {
                if layout.wide {
                    vec![id, remote]
                } else {
                    vec![id]
                }
            };
            // Pods being refused: the namespace is not ready, whatever its
            // twins say.
            let refusing = (o.refusing.pods > 0).then(|| {
                format!(
                    "Not ready: {} pod{} refused: {}",
                    o.refusing.pods,
                    if o.refusing.pods == 1 { "" } else { "s" },
                    o.refusing.why.as_deref().unwrap_or("")
                )
            });
            if o.clusters.is_empty() {
                let mut row = head.clone();
                let status = refusing
                    .clone()
                    .unwrap_or_else(|| "no peer has reported".into());
                row.extend(peer("-".into(), "-".into()));
                row.push(status);
                offloaded.add_row(row);
            }
            // One row per peer; the namespace's columns only on the first.
            for (i, c) in o.clusters.iter().enumerate() {
                let mut row = if i == 0 {
                    head.clone()
                } else {
                    vec![String::new(); head.len()]
                };
                let status = if let Some(refusing) = refusing.clone().filter(|_| i == 0) {
                    refusing
                } else if c.ready {
                    "Ready".to_owned()
                } else {
                    let why = [c.reason.as_deref(), c.message.as_deref()];
                    let why: Vec<&str> = why.into_iter().flatten().collect();
                    format!("Not ready: {}", why.join(": "))
                };
                row.extend(peer(c.cluster_id.to_string(), c.remote_namespace.clone()));
                row.push(status);
                offloaded.add_row(row);
            }
        }
        out.push_str(&format!("\n{offloaded}"));
    }
    if !info.peering_tokens.is_empty() {
        let mut tokens = table(&["Peering token", "Expires", "Tenant", "Claimed by"]);
        for t in &info.peering_tokens {
            for (i, tenant) in t.tenants.iter().enumerate() {
                let head = if i == 0 {
                    let expires = if t.expired {
                        format!("{} (expired)", t.expires)
                    } else {
                        t.expires.clone()
                    };
                    vec![t.id.clone(), expires]
                } else {
                    vec![String::new(), String::new()]
                };
                let mut row = head;
                row.push(tenant.tenant.clone());
                row.push(tenant.claimed_by.clone().unwrap_or_else(|| "-".into()));
                tokens.add_row(row);
            }
        }
        out.push_str(&format!("\n\n{tokens}"));
    }
    let clusterset: Vec<String> = info
        .clusterset
        .lines()
        .iter()
        .flat_map(|line| layout.wrap(line))
        .collect();
    out.push_str(&format!("\n\n{}", clusterset.join("\n")));
    out
}

/// A peering's state in a few words: its virtual node's readiness for an
/// outgoing one; for an incoming one, whether its grant is recorded.
/// The grant, a resource a line, and the Pod Security level its pods
/// run at there.
fn grant_cell(p: &PeeringView) -> String {
    let mut lines: Vec<String> = p
        .grant
        .as_ref()
        .map(|g| show_resources(g).split(", ").map(str::to_owned).collect())
        .unwrap_or_default();
    if let Some(a) = &p.admission {
        lines.push(format!("pod security {}", a.pod_security));
    }
    if lines.is_empty() {
        "-".to_owned()
    } else {
        lines.join("\n")
    }
}

pub(super) fn status_line(p: &PeeringView) -> String {
    match &p.ready {
        Some(r) if r.status == "True" => "Ready".to_owned(),
        Some(r) if r.reason.is_empty() => "Not ready".to_owned(),
        Some(r) => format!("Not ready: {}", r.reason),
        None if p.grant.is_some() => "Granted".to_owned(),
        None => "-".to_owned(),
    }
}

/// The status line, and below it why when something is wrong: the
/// virtual node's message and the conditions that do not hold, so that
/// the overview alone tells what to fix.
pub(super) fn status_detail(p: &PeeringView) -> String {
    let mut lines = vec![status_line(p)];
    if let Some(r) = &p.ready
        && r.status != "True"
        && !r.message.is_empty()
    {
        lines.push(r.message.clone());
    }
    lines.extend(
        p.conditions
            .iter()
            .filter(|c| c.status != "True")
            .map(|c| format!("{}={} ({})", c.type_, c.status, c.reason)),
    );
    lines.join("\n")
}

/// One peering in detail, for `info peer NAME`.
pub(super) fn render_one(p: &PeeringView, layout: Layout) -> String {
    let mut t = layout.table(&[format!("Peering with {}", p.name), String::new()]);
    let dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_owned());
    let mut row = |k: &str, v: String| {
        t.add_row(vec![k.to_owned(), v]);
    };
    row("Cluster ID", p.cluster_id.clone());
    row("Direction", p.direction.clone());
    if let Some(node) = &p.virtual_node {
        row("Virtual node", node.clone());
    }
    row("Status", status_line(p));
    if let Some(r) = &p.ready {
        row("Ready", r.status.clone());
        row(
            "Reason",
            if r.reason.is_empty() {
                "-".into()
            } else {
                r.reason.clone()
            },
        );
        row(
            "Message",
            if r.message.is_empty() {
                "-".into()
            } else {
                r.message.clone()
            },
        );
    }
    let conditions: Vec<String> = p
        .conditions
        .iter()
        .map(|c| {
            let mut line = format!("{}={}", c.type_, c.status);
            if !c.reason.is_empty() {
                line.push_str(&format!(" ({})", c.reason));
            }
            if !c.last_transition_time.is_empty() {
                line.push_str(&format!(" since {}", c.last_transition_time));
            }
            if !c.message.is_empty() {
                line.push_str(&format!(": {}", c.message));
            }
            line
        })
        .collect();
    row(
        "Conditions",
        if conditions.is_empty() {
            "-".into()
        } else {
            conditions.join("\n")
        },
    );
    row("Requested", dash(p.request.as_ref().map(show_resources)));
    row("Granted", dash(p.grant.as_ref().map(show_resources)));
    row(
        "Largest free node",
        dash(p.largest_free_node.as_ref().map(show_resources)),
    );
    row("Cost", dash(p.cost.as_ref().map(show_cost)));
    row("Tenant namespace", dash(p.tenant_namespace.clone()));
    row(
        "Admits",
        dash(p.admission.as_ref().map(Admission::describe)),
    );
    if p.direction != "incoming" {
        row("Certificate expiry", dash(p.certificate_expiry.clone()));
    }
    if let Some(user) = &p.user {
        row("Consumer's user", user.clone());
    }
    match &p.network {
        None => row("Network", "not linked (`liqoctl network connect`)".into()),
        Some(n) => {
            row("Network", n.line());
            row("Tunnel endpoint", dash(n.endpoint.clone()));
            row("Tunnel interface", dash(n.interface.clone()));
            row("Peer's pods seen as", dash(n.peer_pods_seen_as.clone()));
            row("Last handshake", dash(n.last_handshake.clone()));
            row(
                "Traffic",
                format!("{} bytes sent, {} received", n.tx_bytes, n.rx_bytes),
            );
        }
    }
    t.to_string()
}
