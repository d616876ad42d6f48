# fsdp-cpp: turns a file into a C++ source holding its bytes (build time).
#   cmake -DIN=<file> -DOUT=<file.cpp> -DNAMESPACE=<ns> -DNAME=<symbol> -P embed.cmake
# defines <ns>::<NAME>[] (the bytes, then a NUL) and <ns>::<NAME>_size.
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" n)
math(EXPR size "${n} / 2")
# 16 bytes a line, each as '\xNN' (char: bytes above 0x7f need no cast)
string(REGEX REPLACE "(................................)" "\\1\n" bytes "${hex}")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "'\\\\x\\1'," bytes "${bytes}")
get_filename_component(name ${IN} NAME)
file(WRITE ${OUT}.tmp "// Generated from ${name} by cmake/embed.cmake at build time; edit ${name}.
#include <cstddef>

namespace ${NAMESPACE} {
extern const char ${NAME}[];
extern const std::size_t ${NAME}_size;
const char ${NAME}[] = {
${bytes}'\\0'};
const std::size_t ${NAME}_size = ${size};
}  // namespace ${NAMESPACE}
")
file(RENAME ${OUT}.tmp ${OUT})
