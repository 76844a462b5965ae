// precompiled.cpp: the object whose compilation precompiles support/precompiled.hpp.
