// fsdp-cpp: wrap — which modules become units and which parameters each holds.
// defines: ParamDesc, UnitDesc, NamedParamRef, WrapDescription, describe_wrap
//
// describe_wrap is a pure function of the module tree and the policy: it
// reads parameters' identities and shapes, changes nothing and needs no
// communicator (tests/test_unit_layout.cpp runs it on module trees alone).
// The engine then materialises units from the description
// (Engine::build_units, src/unit/engine.cpp).
#pragma once

#include <string>
#include <vector>

#include "fsdp/fully_shard.h"

namespace fsdp::detail {

// One original parameter as a unit will hold it.
struct ParamDesc {
  std::string name;                     // canonical: its first name in the tree walk (pre-order)
  std::vector<std::string> tied_names;  // its further names (tied weights), in walk order
  torch::Tensor tensor;              // the module's parameter (a handle, no copy)
};

struct UnitDesc {
  std::string name;                     // module path; "" for the root
  torch::nn::Module* module = nullptr;  // the unit's root module
  int parent = -1;                      // enclosing unit's index (-1 for the root)
  std::vector<ParamDesc> params;        // in flat-buffer order
};

// Where one name of the unwrapped model's named_parameters() lives.
struct NamedParamRef {
  std::string name;
  int unit = 0;   // index into WrapDescription::units
  int param = 0;  // index into that unit's params
};

struct WrapDescription {
  std::vector<UnitDesc> units;       // pre-order: units[0] is the root
  std::vector<NamedParamRef> named;  // root->named_parameters() order, tied names included
};

// The policy is applied bottom-up (children decided before their parent, a
// parent counting only parameters no nested unit took); the root is always
// a unit and keeps every parameter not claimed by a nested one. A parameter
// registered in several modules (tied weights) lives in exactly one unit:
// the first of its owners' units that encloses all the others; when none
// does (owners in sibling units) this throws fsdp::Error naming them.
WrapDescription describe_wrap(torch::nn::Module& root, const WrapPolicy& policy);

}  // namespace fsdp::detail
