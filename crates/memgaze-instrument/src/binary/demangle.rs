//! Symbol demangling: Rust (legacy and v0) and C++ (Itanium ABI).

use std::fmt::Write;

/// The readable name of a symbol, or `None` when it is not mangled (C
/// names, or anything neither demangler accepts).
///
/// Rust names lose their `::h<hash>` suffix (`{:#}`), as in backtraces.
/// Rust legacy names share the `_ZN` prefix with C++, so Rust is tried first:
/// rustc-demangle only accepts legacy names that end in a Rust hash.
pub fn demangle(raw: &str) -> Option<String> {
    if let Ok(rust) = rustc_demangle::try_demangle(raw) {
        // Written into room for the mangled name's length (a readable name
        // is rarely longer): `format!` would start empty and reallocate
        // several times a name as it doubles.
        let mut text = String::with_capacity(raw.len());
        write!(text, "{rust:#}").expect("writing to a String cannot fail");
        if text != raw {
            return Some(text);
        }
    }
    if raw.starts_with("_Z") {
        let symbol = cpp_demangle::Symbol::new(raw).ok()?;
        let text = symbol.demangle().ok()?;
        if text != raw {
            return Some(text);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demangles_rust_legacy_and_v0_without_hash() {
        assert_eq!(
            demangle("_ZN4core3fmt5write17h0123456789abcdefE").as_deref(),
            Some("core::fmt::write")
        );
        assert_eq!(
            demangle("_RNvCs1234_7mycrate3foo").as_deref(),
            Some("mycrate::foo")
        );
    }

    #[test]
    fn demangles_cpp() {
        assert_eq!(demangle("_ZN3foo3barEi").as_deref(), Some("foo::bar(int)"));
        assert_eq!(
            demangle("_ZNSt6vectorIiSaIiEE9push_backERKi").as_deref(),
            Some("std::vector<int, std::allocator<int> >::push_back(int const&)")
        );
    }

    #[test]
    fn leaves_c_names_alone() {
        assert_eq!(demangle("main"), None);
        assert_eq!(demangle("memcpy"), None);
        assert_eq!(demangle("frame_dummy"), None);
    }
}
