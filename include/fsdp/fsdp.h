// fsdp-cpp: everything a training program includes.
#pragma once

#include "fsdp/checkpoint.h"
#include "fsdp/comm.h"
#include "fsdp/deferred.h"
#include "fsdp/device.h"
#include "fsdp/errors.h"
#include "fsdp/fully_shard.h"
#include "fsdp/init.h"
#include "fsdp/memory.h"
#include "fsdp/optim.h"
#include "fsdp/param_init.h"
#include "fsdp/replicas.h"
#include "fsdp/state_dict.h"
#include "fsdp/trace.h"
