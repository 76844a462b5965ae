// precompiled.cpp: the object whose compilation precompiles precompiled.hpp.
