// libengine's core in one include: tensors, autograd, modules, optimizer, RNG, backends.
#pragma once

#include "engine/allocator.h"
#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/comm.h"
#include "engine/data_parallel.h"
#include "engine/device.h"
#include "engine/dtype.h"
#include "engine/error.h"
#include "engine/loss_scaler.h"
#include "engine/module.h"
#include "engine/optim.h"
#include "engine/rng.h"
#include "engine/safetensors.h"
#include "engine/shape.h"
#include "engine/tensor.h"
