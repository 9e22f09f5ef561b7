//! Lowering `network` blocks and their `attach` blocks into attachment resources
//! (`kinds::attachment`).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use hcl::{Map, Value};

use super::{ATTACH, NETWORK};
use crate::config::lowering::*;
use crate::diag::{Diag, Span};
use crate::kinds::attachment;

pub(crate) fn lower(cx: &mut dyn Engine<'_>) -> Option<ItemValue> {
    cx.eval_network()
}

impl dyn Engine<'_> + '_ {
    fn eval_network(&mut self) -> Option<ItemValue> {
        let (attrs, ctx) = self.simple_block(&NETWORK)?;
        let item = self.item();
        let block = item.block?;
        let file = item.file.clone();
        let name = item.name.clone();
        let header = item.header.clone();
        let address = format!("{}network.{}", self.prefix(), name);
        let (subnet, mtu) = self.network_subnet_and_mtu(&attrs)?;
        let fix_mtu_mismatch = self.fix_mtu_mismatch(&attrs)?;
        let mut attach_values = Map::new();
        let mut attach_deps = BTreeMap::new();
        let mut seen_addr: HashMap<std::net::IpAddr, (String, Span)> = HashMap::new();
        let mut seen_node: HashMap<String, (String, Span)> = HashMap::new();
        let mut names = Vec::new();
        let mut ok = true;
        for ab in block.body.get_blocks("attach") {
            let Some(label) = ab.labels.first() else {
                continue;
            };
            let aname = label.as_str().to_string();
            let aheader = header_span(&file, ab);
            if attach_values.contains_key(&aname) {
                self.diag(
                    Diag::error(
                        "config::duplicate",
                        format!("duplicate attachment `{aname}` in network `{name}`"),
                    )
                    .label(&aheader, "declared again here"),
                );
                ok = false;
                continue;
            }
            // Each attachment is evaluated with the parts of other blocks it refers to, not the
            // whole network's references: with N attachments that would cost N² copies.
            let Some(actx) = self.body_context(&ab.body) else {
                ok = false;
                continue;
            };
            let Some(a) = self.eval_body(&actx, &file, &ab.body, &ATTACH) else {
                ok = false;
                continue;
            };
            let node = a.string("node").unwrap_or_default();
            let interface = a.string("interface").unwrap_or_default();
            let addr_text = a.string("address").unwrap_or_default();
            let mut good = true;
            if let Err(msg) = attachment::check_interface(&interface) {
                self.value_error(&a, "interface", msg, "interface names are 1 to 15 letters, digits, `_`, `-` or `.`, as `ip link` shows them");
                good = false;
            }
            let ip = self.attachment_ip(&a, &addr_text);
            good &= ip.is_some();
            if let Some(ip) = ip {
                let aspan = a.spans.get("address").cloned().unwrap_or(aheader.clone());
                let where_ = Where {
                    network: &name,
                    subnet: &subnet,
                    subnet_span: attrs.spans.get("subnet"),
                    attachment: &aname,
                };
                good &= self.attachment_address_ok(ip, aspan, &where_, &mut seen_addr);
            }
            if let Some(d) = management_subnet(
                &name,
                &subnet,
                &node,
                self.node_host(&node),
                &aheader,
                attrs.spans.get("subnet"),
            ) {
                self.diag(d);
            }
            if let Some((other, ospan)) = seen_node.get(&node) {
                self.diag(
                    Diag::error("config::duplicate_attachment", format!("{node} is attached to network `{name}` twice (`{other}` and `{aname}`)"))
                        .label(&aheader, "second attachment")
                        .label(ospan, "first attachment")
                        .help("a node has one attachment per network"),
                );
                good = false;
            } else {
                seen_node.insert(node.clone(), (aname.clone(), aheader.clone()));
            }
            if !good {
                ok = false;
                continue;
            }
            let res_address = format!("{address}.attach.{aname}");
            let node_name = node.rsplit('.').next().unwrap_or(&node).to_string();
            let roce = self.observed_roce(&res_address);
            let config = attachment::Desired {
                network: address.clone(),
                node: node.clone(),
                interface: interface.clone(),
                address: addr_text.clone(),
                prefix_len: subnet.prefix_len(),
                mtu,
                roce: roce.clone(),
            };
            let config = crate::kind::Configuration::of(config);
            let mut deps = ctx.deps.clone();
            deps.extend(self.extra_deps().iter().cloned());
            self.add_resource(Resource {
                address: res_address.clone(),
                kind: KindId::Attachment,
                node: Some(node.clone()),
                config,
                sensitive: Vec::new(),
                ephemeral: Vec::new(),
                deps,
                replace_triggered_by: BTreeSet::new(),
                group: None,
                span: aheader,
            });
            names.push(res_address.clone());
            let mut av = attachment_value(
                &a,
                &res_address,
                &aname,
                node_name,
                interface,
                &addr_text,
                &subnet,
            );
            av.insert("roce".into(), roce_value(roce.as_ref()));
            attach_values.insert(aname.clone(), Value::Object(av));
            attach_deps.insert(aname, DepTree::Leaf(BTreeSet::from([res_address])));
        }
        if !ok {
            return None;
        }
        self.add_network(Network {
            address: address.clone(),
            name: name.clone(),
            subnet,
            mtu,
            fix_mtu_mismatch,
            attachments: names,
            span: header,
        });
        Some(network_value(
            address,
            name,
            &subnet,
            mtu,
            attach_values,
            attach_deps,
        ))
    }

    /// What the plan-time read found of an attachment's RDMA ports on its node
    /// (`kinds::attachment::machine::read`).
    fn observed_roce(&self, address: &str) -> Option<attachment::Roce> {
        let v = self.readings().kinds.get(address)?;
        serde_json::from_value(v.clone()).ok()
    }

    /// `on_mtu_mismatch`: whether ends found at different MTUs are fixed by the apply (`"fix"`)
    /// rather than refused (`"refuse"`, the default); `None` once a bad value is reported.
    fn fix_mtu_mismatch(&mut self, attrs: &Attrs) -> Option<bool> {
        match attrs.string("on_mtu_mismatch").as_deref() {
            None | Some("refuse") => Some(false),
            Some("fix") => Some(true),
            Some(other) => {
                self.value_error(
                    attrs,
                    "on_mtu_mismatch",
                    format!("{other:?} is not what to do when the fabric's ends differ in MTU"),
                    "\"refuse\" (the plan is refused, naming each end) or \"fix\" (a warning, and the apply sets the network's MTU on every end)",
                );
                None
            }
        }
    }

    /// The network's `subnet` (a network address) and `mtu` (1500 unless set); both checked,
    /// each error reported.
    fn network_subnet_and_mtu(&mut self, attrs: &Attrs) -> Option<(ipnet::IpNet, u32)> {
        let subnet_text = attrs.string("subnet").unwrap_or_default();
        let subnet: Option<ipnet::IpNet> = match subnet_text.parse::<ipnet::IpNet>() {
            Ok(net) if net.trunc() == net => Some(net),
            Ok(net) => {
                self.value_error(
                    attrs,
                    "subnet",
                    format!("{subnet_text:?} has host bits set"),
                    &format!("write the network address: {}", net.trunc()),
                );
                None
            }
            Err(_) => {
                self.value_error(
                    attrs,
                    "subnet",
                    format!("{subnet_text:?} is not a CIDR block"),
                    "write it as ADDRESS/PREFIX, e.g. \"192.168.200.0/24\"",
                );
                None
            }
        };
        let mtu = match attrs.number("mtu") {
            None => Some(1500u32),
            Some(m) if (576.0..=9216.0).contains(&m) && m.fract() == 0.0 => Some(m as u32),
            Some(m) => {
                self.value_error(
                    attrs,
                    "mtu",
                    format!("{m} is not a usable MTU"),
                    "an MTU is 576 to 9216 (9000 for jumbo frames)",
                );
                None
            }
        };
        Some((subnet?, mtu?))
    }

    /// An attachment's address: inside the subnet, not its network or broadcast address, and
    /// not another attachment's (`seen`); each problem reported.
    fn attachment_address_ok(
        &mut self,
        ip: std::net::IpAddr,
        aspan: Span,
        w: &Where<'_>,
        seen: &mut HashMap<std::net::IpAddr, (String, Span)>,
    ) -> bool {
        let (name, subnet, aname) = (w.network, w.subnet, w.attachment);
        if !subnet.contains(&ip) {
            self.diag(
                Diag::error("config::address_outside_subnet", format!("attachment `{aname}`: {ip} is outside the subnet {subnet} of network `{name}`"))
                    .label(&aspan, format!("not in {subnet}"))
                    .maybe_label(w.subnet_span, "the network's subnet")
                    .help(format!("pick an address between {} and {}", first_host(subnet), last_host(subnet))),
            );
            false
        } else if ip == subnet.network() && subnet.prefix_len() < subnet.max_prefix_len() - 1 {
            self.diag(
                Diag::error(
                    "config::invalid_value",
                    format!("attachment `{aname}`: {ip} is the network address of {subnet}"),
                )
                .label(&aspan, "network address")
                .help(format!(
                    "the first usable address is {}",
                    first_host(subnet)
                )),
            );
            false
        } else if let Some(d) = broadcast_address(subnet, ip, aname, &aspan) {
            self.diag(d);
            false
        } else if let Some((other, ospan)) = seen.get(&ip) {
            self.diag(
                Diag::error(
                    "config::duplicate_address",
                    format!(
                        "attachments `{other}` and `{aname}` of network `{name}` both use {ip}"
                    ),
                )
                .label(&aspan, format!("{ip} again"))
                .label(ospan, format!("{ip} first used here"))
                .help("every attachment needs its own address"),
            );
            false
        } else {
            seen.insert(ip, (aname.to_string(), aspan));
            true
        }
    }

    /// The attachment's `address`, an IP address without a prefix (the error reported).
    fn attachment_ip(&mut self, a: &Attrs, addr_text: &str) -> Option<std::net::IpAddr> {
        match addr_text.parse() {
            Ok(ip) => Some(ip),
            Err(_) => {
                let hint = if addr_text.contains('/') {
                    "write the address without a prefix; the prefix comes from the network's subnet"
                } else {
                    "write an IP address such as \"192.168.200.1\""
                };
                self.value_error(
                    a,
                    "address",
                    format!("{addr_text:?} is not an IP address"),
                    hint,
                );
                None
            }
        }
    }
}

/// Where an attachment's address is checked: its network, the subnet and its span, its name.
struct Where<'w> {
    network: &'w str,
    subnet: &'w ipnet::IpNet,
    subnet_span: Option<&'w Span>,
    attachment: &'w str,
}

/// What modules read of an attachment (`network.N.attach.A`): its node object, so that
/// `attach.x.node.name` works, and its address with the subnet's prefix.
fn attachment_value(
    a: &Attrs,
    res_address: &str,
    aname: &str,
    node_name: String,
    interface: String,
    addr_text: &str,
    subnet: &ipnet::IpNet,
) -> Map<String, Value> {
    let mut av = Map::new();
    // The attachment value carries the node object so modules can read `attach.x.node.name`.
    let node_value = a.raw.get("node").cloned().unwrap_or(Value::Null);
    av.insert("kind".into(), "attachment".into());
    av.insert("id".into(), res_address.to_string().into());
    av.insert("name".into(), aname.to_string().into());
    av.insert("node".into(), node_value);
    av.insert("node_name".into(), node_name.into());
    av.insert("interface".into(), interface.into());
    av.insert("address".into(), addr_text.to_string().into());
    av.insert(
        "cidr".into(),
        format!("{addr_text}/{}", subnet.prefix_len()).into(),
    );
    av
}

/// `attach.x.roce`: the RDMA ports on the fabric (`DEVICE:PORT`) and the GID index of the
/// attachment's address (null while unknown), or null where no RDMA port is on the fabric or
/// nothing was read.
fn roce_value(roce: Option<&attachment::Roce>) -> Value {
    let Some(r) = roce else {
        return Value::Null;
    };
    let mut m = Map::new();
    m.insert(
        "gid_index".into(),
        r.gid_index.map_or(Value::Null, Value::from),
    );
    m.insert(
        "ports".into(),
        Value::Array(r.ports.iter().cloned().map(Value::from).collect()),
    );
    Value::Object(m)
}

/// An attachment on the subnet's broadcast address: the kernel would take every packet sent
/// to the subnet as its own. (`/31` and `/32` have no broadcast address.)
fn broadcast_address(
    subnet: &ipnet::IpNet,
    ip: std::net::IpAddr,
    aname: &str,
    span: &Span,
) -> Option<Diag> {
    let ipnet::IpNet::V4(n) = subnet else {
        return None;
    };
    if n.prefix_len() >= 31 || ip != std::net::IpAddr::V4(n.broadcast()) {
        return None;
    }
    Some(
        Diag::error(
            "config::invalid_value",
            format!("attachment `{aname}`: {ip} is the broadcast address of {subnet}"),
        )
        .label(span, "broadcast address")
        .help(format!("the last usable address is {}", last_host(subnet))),
    )
}

/// A fabric whose subnet holds a node's own SSH address is the management network: the
/// attachment would add a second address to the network the node is reached by, and the
/// traffic meant for the fabric would go out through the management interface.
fn management_subnet(
    network: &str,
    subnet: &ipnet::IpNet,
    node: &str,
    host: Option<String>,
    attach: &Span,
    subnet_span: Option<&Span>,
) -> Option<Diag> {
    let ip: std::net::IpAddr = host?.parse().ok()?;
    if !subnet.contains(&ip) {
        return None;
    }
    Some(
        Diag::warning(
            "config::fabric_is_management",
            format!("network `{network}`: its subnet {subnet} contains {node}'s SSH address {ip}"),
        )
        .label(attach, format!("{node} is reached over SSH at {ip}, inside {subnet}"))
        .maybe_label(subnet_span, "the fabric's subnet")
        .help("that is the management network: give the fabric its own subnet on the high-speed interfaces (e.g. 192.168.200.0/24)"),
    )
}

fn first_host(net: &ipnet::IpNet) -> String {
    net.hosts()
        .next()
        .map(|h| h.to_string())
        .unwrap_or_else(|| net.network().to_string())
}

fn last_host(net: &ipnet::IpNet) -> String {
    match net {
        ipnet::IpNet::V4(n) => n.hosts().last().map(|h| h.to_string()).unwrap_or_default(),
        ipnet::IpNet::V6(n) => n.broadcast().to_string(),
    }
}

/// The value a network block gives (`network.N`): its subnet, MTU and attachments.
fn network_value(
    address: String,
    name: String,
    subnet: &ipnet::IpNet,
    mtu: u32,
    attach_values: Map<String, Value>,
    attach_deps: BTreeMap<String, DepTree>,
) -> ItemValue {
    let mut value = Map::new();
    value.insert("kind".into(), "network".into());
    value.insert("id".into(), address.into());
    value.insert("name".into(), name.into());
    value.insert("subnet".into(), subnet.to_string().into());
    value.insert("mtu".into(), Value::from(mtu));
    value.insert("prefix_len".into(), Value::from(subnet.prefix_len()));
    value.insert("netmask".into(), subnet.netmask().to_string().into());
    value.insert("attach".into(), Value::Object(attach_values));
    let mut tree = BTreeMap::new();
    tree.insert("attach".to_string(), DepTree::Keyed(attach_deps));
    ItemValue {
        value: Value::Object(value),
        sensitive: false,
        ephemeral: false,
        sensitive_keys: HashSet::new(),
        deps: DepTree::Keyed(tree),
        all_resources: BTreeSet::new(),
    }
}
