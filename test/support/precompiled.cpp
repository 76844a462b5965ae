// precompiled.cpp: empty. The unit of the target test_headers, which
// precompiles support/precompiled.hpp for every test target
// (test/CMakeLists.txt).
