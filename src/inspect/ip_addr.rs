//! `ip -j addr` as a node prints it: its interfaces, their MTU, state and addresses (the
//! attachment kind reads them; the fake node answers with them).

use serde::Serialize;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Interface {
    pub name: String,
    pub mtu: u32,
    pub state: String,
    /// `address/prefix`
    pub addresses: Vec<String>,
}

/// `ip -j addr` output.
pub fn parse_ip_addr(json: &str) -> Result<Vec<Interface>, String> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("cannot read `ip -j addr`: {e}"))?;
    let list = v.as_array().ok_or("`ip -j addr` did not print a list")?;
    Ok(list
        .iter()
        .filter_map(|i| {
            Some(Interface {
                name: i.get("ifname")?.as_str()?.to_string(),
                mtu: i.get("mtu").and_then(|m| m.as_u64()).unwrap_or(0) as u32,
                state: i
                    .get("operstate")
                    .and_then(|s| s.as_str())
                    .unwrap_or("UNKNOWN")
                    .to_string(),
                addresses: i
                    .get("addr_info")
                    .and_then(|a| a.as_array())
                    .map(|a| {
                        a.iter()
                            .filter_map(|x| {
                                Some(format!(
                                    "{}/{}",
                                    x.get("local")?.as_str()?,
                                    x.get("prefixlen")?.as_u64()?
                                ))
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ip_json() {
        let j = r#"[{"ifindex":1,"ifname":"lo","mtu":65536,"operstate":"UNKNOWN","addr_info":[{"family":"inet","local":"127.0.0.1","prefixlen":8}]},
                  {"ifindex":5,"ifname":"enp1s0f0np0","mtu":9000,"operstate":"UP","addr_info":[]}]"#;
        let i = parse_ip_addr(j).unwrap();
        assert_eq!(i[0].addresses, vec!["127.0.0.1/8"]);
        assert_eq!((i[1].name.as_str(), i[1].mtu), ("enp1s0f0np0", 9000));
        assert!(parse_ip_addr("not json").is_err());
    }
}
