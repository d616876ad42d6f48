// fsdp-cpp: see gloo_names/gloo/names.h.
#pragma once
#include "../names.h"
