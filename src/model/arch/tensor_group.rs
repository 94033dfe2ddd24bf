//! Typed groups of a layer's tensors, each tensor's GGUF name written once. An architecture declares a
//! layer as a struct (or an enum of alternatives) of tensors and smaller groups, generic over what each
//! slot holds: [`Declared`] (shape, required, split) when the model is checked and placed, a mapped
//! tensor when a stage computes. The graph reads the bound struct's fields (`w.attention.q`), so a name
//! is never looked up again by string, and a tensor the graph reads is one the declaration lists.
//!
//! [`tensor_group!`] writes the struct or enum and its [`TensorGroup`] impl: visiting every present
//! slot with its name, and binding a declared group to the tensors of a file ([`Binder`]).

use super::super::layout::{ExpectedTensor, Part, Split};

/// One tensor as an architecture declares it, before it is named: its shape (ggml order), whether a
/// file must have it, and how a tensor-parallel group divides it.
#[derive(Clone, Debug, PartialEq)]
pub struct Declared {
    pub shape: Vec<u64>,
    pub required: bool,
    pub split: Split,
}

impl Declared {
    /// A tensor every file of the architecture has, held whole by every rank.
    pub fn new(shape: &[usize]) -> Declared {
        Declared { shape: shape.iter().map(|&n| n as u64).collect(), required: true, split: Split::Whole }
    }

    /// A tensor a file may lack.
    pub fn optional(shape: &[usize]) -> Declared {
        Declared { required: false, ..Declared::new(shape) }
    }

    /// The same tensor, required or not as `required` says.
    pub fn required_if(self, required: bool) -> Declared {
        Declared { required, ..self }
    }

    /// The same tensor, divided among a tensor-parallel group's ranks along dimension `dim` (0 is the
    /// row length) by their share of `part`.
    pub fn split(self, dim: usize, part: Part) -> Declared {
        Declared { split: Split::Along { dim, part }, ..self }
    }

    /// The same tensor, its first `whole` rows (last dimension) held by every rank, the rest divided by
    /// their share of `part`.
    pub fn split_after(self, whole: usize, part: Part) -> Declared {
        Declared { split: Split::AfterWhole { whole: whole as u64, part }, ..self }
    }
}

/// Binds a declared group's slots to tensors of a file (or to anything else: a group of `T` becomes a
/// group of `U`).
pub trait Binder<T, U, E> {
    /// A slot every layer of this kind has (the file was checked for it).
    fn required(&mut self, name: &'static str, declared: &T) -> Result<U, E>;
    /// A slot the declaration lists as perhaps absent (or as required for this architecture, in a
    /// slot other architectures leave out): `None` when absent and allowed to be.
    fn optional(&mut self, name: &'static str, declared: &T) -> Result<Option<U>, E>;
}

/// A group of tensor slots holding `T` each (see the module's documentation).
pub trait TensorGroup<T> {
    /// The same group with slots holding `U`.
    type Rebound<U>;

    /// Calls `f` with every present slot and its short name (`attn_q.weight` of `blk.N.attn_q.weight`),
    /// in declaration order.
    fn visit<'a>(&'a self, f: &mut dyn FnMut(&'static str, &'a T));

    /// [`TensorGroup::visit`] with each slot writable.
    fn visit_mut(&mut self, f: &mut dyn FnMut(&'static str, &mut T));

    /// This group with every slot bound by `binder`.
    fn bind<U, E>(&self, binder: &mut dyn Binder<T, U, E>) -> Result<Self::Rebound<U>, E>;
}

/// The tensors of a declared group of layer `layer`, named `blk.{layer}.{short name}`.
pub fn named(layer: usize, group: &impl TensorGroup<Declared>) -> Vec<ExpectedTensor> {
    let mut list = Vec::new();
    group.visit(&mut |name, d| {
        list.push(ExpectedTensor {
            name: format!("blk.{layer}.{name}"),
            shape: d.shape.clone(),
            required: d.required,
            split: d.split,
        })
    });
    list
}

/// Writes a group of tensor slots, generic over what a slot holds, and its [`TensorGroup`] impl.
///
/// A struct lists its fields as `name: kind what`, where kind is `tensor "gguf.name"` (always
/// present), `optional "gguf.name"` (an `Option`), `group Type` (a smaller group) or
/// `optional_group Type`. An enum lists alternatives of one group each: `Variant(Type)`.
macro_rules! tensor_group {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$field_meta:meta])* $field:ident : $kind:ident $what:tt ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        pub struct $name<T> {
            $( $(#[$field_meta])* pub $field: $crate::model::arch::tensor_group!(@type $kind $what T), )*
        }

        // Written out: `derive` cannot see through the fields' type macros.
        impl<T: Clone> Clone for $name<T> {
            fn clone(&self) -> Self {
                $name { $( $field: self.$field.clone(), )* }
            }
        }

        impl<T: PartialEq> PartialEq for $name<T> {
            fn eq(&self, other: &Self) -> bool {
                true $( && self.$field == other.$field )*
            }
        }

        impl<T: std::fmt::Debug> std::fmt::Debug for $name<T> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($name)) $( .field(stringify!($field), &self.$field) )* .finish()
            }
        }

        impl<T> $crate::model::arch::TensorGroup<T> for $name<T> {
            type Rebound<U> = $name<U>;

            fn visit<'a>(&'a self, f: &mut dyn FnMut(&'static str, &'a T)) {
                $( $crate::model::arch::tensor_group!(@visit $kind $what (&self.$field) f); )*
            }

            fn visit_mut(&mut self, f: &mut dyn FnMut(&'static str, &mut T)) {
                $( $crate::model::arch::tensor_group!(@visit_mut $kind $what (&mut self.$field) f); )*
            }

            fn bind<U, E>(&self, binder: &mut dyn $crate::model::arch::Binder<T, U, E>) -> Result<$name<U>, E> {
                Ok($name {
                    $( $field: $crate::model::arch::tensor_group!(@bind $kind $what (&self.$field) binder), )*
                })
            }
        }
    };
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$variant_meta:meta])* $variant:ident($group:ident) ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq)]
        pub enum $name<T> {
            $( $(#[$variant_meta])* $variant($group<T>), )*
        }

        impl<T> $crate::model::arch::TensorGroup<T> for $name<T> {
            type Rebound<U> = $name<U>;

            fn visit<'a>(&'a self, f: &mut dyn FnMut(&'static str, &'a T)) {
                match self {
                    $( $name::$variant(group) => $crate::model::arch::TensorGroup::visit(group, f), )*
                }
            }

            fn visit_mut(&mut self, f: &mut dyn FnMut(&'static str, &mut T)) {
                match self {
                    $( $name::$variant(group) => $crate::model::arch::TensorGroup::visit_mut(group, f), )*
                }
            }

            fn bind<U, E>(&self, binder: &mut dyn $crate::model::arch::Binder<T, U, E>) -> Result<$name<U>, E> {
                Ok(match self {
                    $( $name::$variant(group) => $name::$variant($crate::model::arch::TensorGroup::bind(group, binder)?), )*
                })
            }
        }
    };
    (@type tensor $tensor:literal $t:ident) => { $t };
    (@type optional $tensor:literal $t:ident) => { Option<$t> };
    (@type group $group:ident $t:ident) => { $group<$t> };
    (@type optional_group $group:ident $t:ident) => { Option<$group<$t>> };
    (@visit tensor $tensor:literal ($slot:expr) $f:ident) => { $f($tensor, $slot) };
    (@visit optional $tensor:literal ($slot:expr) $f:ident) => {
        if let Some(t) = $slot { $f($tensor, t) }
    };
    (@visit group $group:ident ($slot:expr) $f:ident) => { $crate::model::arch::TensorGroup::visit($slot, $f) };
    (@visit optional_group $group:ident ($slot:expr) $f:ident) => {
        if let Some(group) = $slot { $crate::model::arch::TensorGroup::visit(group, $f) }
    };
    (@visit_mut tensor $tensor:literal ($slot:expr) $f:ident) => { $f($tensor, $slot) };
    (@visit_mut optional $tensor:literal ($slot:expr) $f:ident) => {
        if let Some(t) = $slot { $f($tensor, t) }
    };
    (@visit_mut group $group:ident ($slot:expr) $f:ident) => { $crate::model::arch::TensorGroup::visit_mut($slot, $f) };
    (@visit_mut optional_group $group:ident ($slot:expr) $f:ident) => {
        if let Some(group) = $slot { $crate::model::arch::TensorGroup::visit_mut(group, $f) }
    };
    (@bind tensor $tensor:literal ($slot:expr) $b:ident) => { $crate::model::arch::Binder::required($b, $tensor, $slot)? };
    (@bind optional $tensor:literal ($slot:expr) $b:ident) => {
        match $slot { Some(t) => $crate::model::arch::Binder::optional($b, $tensor, t)?, None => None }
    };
    (@bind group $group:ident ($slot:expr) $b:ident) => { $crate::model::arch::TensorGroup::bind($slot, $b)? };
    (@bind optional_group $group:ident ($slot:expr) $b:ident) => {
        match $slot { Some(group) => Some($crate::model::arch::TensorGroup::bind(group, $b)?), None => None }
    };
}

pub(crate) use tensor_group;

#[cfg(test)]
mod tests {
    use super::*;

    tensor_group! {
        /// A group for the tests.
        pub struct Inner {
            a: tensor "a.weight",
            b: optional "b.bias",
        }
    }

    tensor_group! {
        pub struct Outer {
            norm: tensor "norm.weight",
            inner: group Inner,
            extra: optional_group Inner,
        }
    }

    tensor_group! {
        pub enum Either {
            One(Inner),
            Two(Outer),
        }
    }

    struct Lookup<'a>(&'a [&'static str]);

    impl Binder<Declared, &'static str, String> for Lookup<'_> {
        fn required(&mut self, name: &'static str, _: &Declared) -> Result<&'static str, String> {
            self.0.iter().find(|n| **n == name).copied().ok_or(format!("{name} is missing"))
        }
        fn optional(&mut self, name: &'static str, d: &Declared) -> Result<Option<&'static str>, String> {
            match (self.0.iter().find(|n| **n == name), d.required) {
                (Some(n), _) => Ok(Some(n)),
                (None, true) => Err(format!("{name} is missing")),
                (None, false) => Ok(None),
            }
        }
    }

    fn declared() -> Outer<Declared> {
        Outer {
            norm: Declared::new(&[4]),
            inner: Inner { a: Declared::new(&[4, 8]).split(1, Part::FeedForward), b: Some(Declared::optional(&[8])) },
            extra: None,
        }
    }

    #[test]
    fn names_follow_the_declaration_order_with_the_layer_prefix() {
        let names: Vec<String> = named(3, &declared()).into_iter().map(|t| t.name).collect();
        assert_eq!(names, ["blk.3.norm.weight", "blk.3.a.weight", "blk.3.b.bias"]);
        let inner = named(0, &declared().inner);
        assert_eq!(inner[0].split, Split::Along { dim: 1, part: Part::FeedForward });
        assert_eq!((inner[1].shape.clone(), inner[1].required), (vec![8], false));
    }

    #[test]
    fn binding_fills_present_slots_and_refuses_missing_required_ones() {
        let bound = declared().bind(&mut Lookup(&["norm.weight", "a.weight"])).unwrap();
        assert_eq!(bound, Outer { norm: "norm.weight", inner: Inner { a: "a.weight", b: None }, extra: None });
        let err = declared().bind(&mut Lookup(&["norm.weight"])).unwrap_err();
        assert_eq!(err, "a.weight is missing");
        let mut strict = declared();
        strict.inner.b = strict.inner.b.map(|d| d.required_if(true));
        assert!(strict.bind(&mut Lookup(&["norm.weight", "a.weight"])).is_err());
    }

    #[test]
    fn an_enum_visits_and_binds_its_one_alternative() {
        let either = Either::One(Inner { a: Declared::new(&[1]), b: None });
        let mut seen = Vec::new();
        either.visit(&mut |name, _| seen.push(name));
        assert_eq!(seen, ["a.weight"]);
        let mut bound = either.bind(&mut Lookup(&["a.weight"])).unwrap();
        bound.visit_mut(&mut |_, slot| *slot = "moved");
        assert_eq!(bound, Either::One(Inner { a: "moved", b: None }));
        assert_eq!(named(1, &Either::Two(declared())).len(), 3);
    }
}
