//! A fabric attachment: an address and MTU on one interface of one node.

/// Changing the address or MTU is done on the live interface; another node or interface is a new
/// attachment.
pub const IN_PLACE: &[&str] = &["address", "prefix_len", "mtu"];

/// Interface names reach `ip` commands on the node: allow only what the kernel accepts and no
/// shell metacharacters.
pub fn check_interface(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 15 {
        return Err(format!("{name:?} is not 1 to 15 characters long"));
    }
    if name == "." || name == ".." {
        return Err(format!("{name:?} is not an interface name"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(format!(
            "{name:?} contains {c:?}, which an interface name cannot"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names() {
        assert!(check_interface("enp1s0f0np0").is_ok());
        assert!(check_interface("eth0.100").is_ok());
        assert!(check_interface("").is_err());
        assert!(check_interface("a_very_long_interface").is_err());
        assert!(check_interface("eth0;reboot").is_err());
        assert!(check_interface("eth 0").is_err());
        assert!(check_interface("..").is_err());
    }
}
