//! String interning: host attribute keys and values become dense `u32`
//! symbols, so attribute indexes and constraints compare integers.

use std::collections::HashMap;

/// An interned string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sym(pub(crate) u32);

impl Sym {
    /// Dense index of the symbol.
    pub fn idx(self) -> usize {
        self.0 as usize
    }
}

/// Interns strings; symbols are never freed (attribute vocabularies are
/// small and stable: zones, racks, models).
#[derive(Clone, Debug, Default)]
pub struct Interner {
    strings: Vec<Box<str>>,
    by_string: HashMap<Box<str>, u32>,
}

impl Interner {
    /// An empty interner.
    pub fn new() -> Self {
        Self::default()
    }

    /// The symbol of `s`, creating it if new.
    pub fn intern(&mut self, s: &str) -> Sym {
        if let Some(&i) = self.by_string.get(s) {
            return Sym(i);
        }
        let i = u32::try_from(self.strings.len()).expect("symbols fit in u32");
        self.strings.push(s.into());
        self.by_string.insert(s.into(), i);
        Sym(i)
    }

    /// The symbol of `s` if it was ever interned.
    pub fn get(&self, s: &str) -> Option<Sym> {
        self.by_string.get(s).map(|&i| Sym(i))
    }

    /// The string of a symbol.
    pub fn resolve(&self, sym: Sym) -> &str {
        &self.strings[sym.idx()]
    }

    /// Number of symbols.
    pub fn len(&self) -> usize {
        self.strings.len()
    }

    /// True when nothing was interned.
    pub fn is_empty(&self) -> bool {
        self.strings.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interning_is_stable() {
        let mut interner = Interner::new();
        let a = interner.intern("zone");
        let b = interner.intern("rack");
        assert_eq!(interner.intern("zone"), a);
        assert_ne!(a, b);
        assert_eq!(interner.resolve(b), "rack");
        assert_eq!(interner.get("gpu"), None);
        assert_eq!(interner.len(), 2);
    }
}
