//! Network functions: CIDR prefixes and host addresses.

use super::*;

pub(super) fn want_prefix(f: &str, v: &Value) -> Result<IpNet, String> {
    let s = match v {
        Value::String(s) => s,
        _ => return Err(type_err(f, "the prefix", "a CIDR prefix string", v)),
    };
    s.parse::<IpNet>()
        .map(|net| net.trunc())
        .map_err(|_| format!("{f}: {} is not a valid CIDR prefix", quote(s)))
}

pub(super) fn addr_bits(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

pub(super) fn bits_addr(like: &IpNet, bits: u128) -> Result<IpAddr, String> {
    match like {
        IpNet::V4(_) => u32::try_from(bits)
            .map(|b| IpAddr::V4(b.into()))
            .map_err(|_| "address out of range".to_string()),
        IpNet::V6(_) => Ok(IpAddr::V6(bits.into())),
    }
}

pub(super) fn cidrcontains(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "cidrcontains";
    let net = want_prefix(F, arg(&args, F, 0)?)?;
    let other = arg(&args, F, 1)?;
    let s = match other {
        Value::String(s) => s,
        _ => {
            return Err(type_err(
                F,
                "the second argument",
                "an IP address or CIDR prefix string",
                other,
            ))
        }
    };
    let (is_v4, contained) = if s.contains('/') {
        let inner = s
            .parse::<IpNet>()
            .map_err(|_| format!("{F}: {} is not a valid CIDR prefix", quote(s)))?;
        (matches!(inner, IpNet::V4(_)), net.contains(&inner))
    } else {
        let ip = s
            .parse::<IpAddr>()
            .map_err(|_| format!("{F}: {} is not a valid IP address", quote(s)))?;
        (ip.is_ipv4(), net.contains(&ip))
    };
    if is_v4 != matches!(net, IpNet::V4(_)) {
        return Err(format!(
            "{F}: address family of {} does not match prefix {net}",
            quote(s)
        ));
    }
    Ok(Value::Bool(contained))
}

/// Offset of host number `hostnum` inside a block with `host_bits` host bits;
/// negative numbers count back from the end (-1 is the last address).
pub(super) fn host_offset(host_bits: u8, hostnum: i128) -> Option<u128> {
    let count = 1u128.checked_shl(u32::from(host_bits)); // None means 2^128
    if hostnum >= 0 {
        let n = u128::try_from(hostnum).ok()?;
        match count {
            Some(c) if n >= c => None,
            _ => Some(n),
        }
    } else {
        let mag = hostnum.unsigned_abs();
        match count {
            Some(c) => c.checked_sub(mag),
            None => Some(u128::MAX - (mag - 1)),
        }
    }
}

pub(super) fn cidrhost(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "cidrhost";
    let net = want_prefix(F, arg(&args, F, 0)?)?;
    let hostnum = want_int(F, "hostnum", arg(&args, F, 1)?)?;
    let host_bits = net.max_prefix_len() - net.prefix_len();
    let offset = host_offset(host_bits, hostnum).ok_or_else(|| {
        format!("{F}: prefix {net} does not accommodate a host numbered {hostnum}")
    })?;
    let addr =
        bits_addr(&net, addr_bits(net.network()) | offset).map_err(|e| format!("{F}: {e}"))?;
    Ok(Value::String(addr.to_string()))
}

pub(super) fn cidrnetmask(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "cidrnetmask";
    let net = want_prefix(F, arg(&args, F, 0)?)?;
    match net {
        IpNet::V4(v4) => Ok(Value::String(v4.netmask().to_string())),
        IpNet::V6(_) => Err(format!("{F}: only IPv4 prefixes have a netmask, got {net}")),
    }
}

pub(super) fn cidrsubnet(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "cidrsubnet";
    let net = want_prefix(F, arg(&args, F, 0)?)?;
    let newbits = want_int(F, "newbits", arg(&args, F, 1)?)?;
    let netnum = want_int(F, "netnum", arg(&args, F, 2)?)?;
    let max = i128::from(net.max_prefix_len());
    let len = i128::from(net.prefix_len());
    if newbits < 0 {
        return Err(format!("{F}: newbits must not be negative, got {newbits}"));
    }
    let new_len = len + newbits;
    if new_len > max {
        return Err(format!(
            "{F}: not enough address space to extend prefix {net} by {newbits} bits (at most {} bits available)",
            max - len
        ));
    }
    let new_len = u8::try_from(new_len).map_err(|_| format!("{F}: prefix length out of range"))?;
    let newbits = u32::try_from(newbits).map_err(|_| format!("{F}: newbits out of range"))?;
    let fits = match (u128::try_from(netnum), 1u128.checked_shl(newbits)) {
        (Ok(n), Some(limit)) => n < limit,
        (Ok(_), None) => true,
        (Err(_), _) => false,
    };
    if !fits {
        return Err(format!(
            "{F}: prefix extension of {newbits} bits does not accommodate a subnet numbered {netnum}"
        ));
    }
    let netnum = u128::try_from(netnum).map_err(|_| format!("{F}: netnum out of range"))?;
    let shift = u32::from(net.max_prefix_len() - new_len);
    let offset = if netnum == 0 {
        0
    } else {
        netnum
            .checked_shl(shift)
            .ok_or_else(|| format!("{F}: netnum out of range"))?
    };
    let addr =
        bits_addr(&net, addr_bits(net.network()) | offset).map_err(|e| format!("{F}: {e}"))?;
    Ok(Value::String(format!("{addr}/{new_len}")))
}
