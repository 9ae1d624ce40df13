// Golden cases 4.. on the engine in every pool/backing/lookahead configuration (golden-suite.ts).
import { goldenCases } from "../golden/cases.ts";
import { goldenSuite } from "./golden-suite.ts";

goldenSuite(4, goldenCases.length);
