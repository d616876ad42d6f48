// build/bin/tiny: the FSDP guide's demo (tiny.cpp).
#include "tiny/tiny.h"

int main(int argc, char** argv) { return tiny::run(argc, argv); }
